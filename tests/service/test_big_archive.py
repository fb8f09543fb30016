"""A generated Llama with 350 MB of fp16 weights in external data, uploaded as a .tar through ``mirserve serve``
with the real engine: the job optimizes it, verifies it in pieces (its weights exceed one 256 MB piece) and
publishes the artifact with its weights in external data."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.archives import pack_directory
from tests.service.server import Server

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.models
def test_a_generated_llama_in_a_tar_optimizes_and_verifies_in_pieces(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    subprocess.run([sys.executable, str(REPO / "bench" / "make_llama.py"), str(source / "llama.onnx"),
                    "--layers", "1", "--hidden", "2048", "--heads", "16", "--kv-heads", "4", "--intermediate",
                    "5504"], check=True, capture_output=True)
    weights = (source / "llama.onnx.data").stat().st_size
    assert weights > 300e6
    with Server(tmp_path / "data", max_upload_mb=512) as server:
        response = server.submit(pack_directory("tar", source), "arm/fp16/nchw,arm/fp32/nchw",
                                 options={"atol": 0.02}, filename="llama.tar")
        assert response.status_code == 202, response.text
        job = server.wait_for(response.json()["id"], timeout=600)
        assert job["status"] == "succeeded", job["error"]
        assert job["summary"]["verified"] is True
        report = server.client.get(f"/jobs/{job['id']}/report").json()
        assert report["verification"]["pieces_of_mb"] == 256
