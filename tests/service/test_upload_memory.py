"""The API's memory does not grow with an upload: a 300 MB archive streams to disk through ``mirserve serve``
while the API process's peak resident memory is watched (Linux's VmHWM, reset just before the upload)."""
from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from tests.service.archives import model_with_external_data
from tests.service.conftest import FAKE_ENGINE
from tests.service.server import Server

DATA_BYTES = 300 << 20
GROWTH_LIMIT = 100 << 20


def sparse_tar(path: Path, model: bytes, data_bytes: int) -> None:
    """A tar of ``model.onnx`` and ``weights.bin`` (zeros), the zeros left as a hole in the file."""
    with open(path, "wb") as stream:
        for name, size, content in (("model.onnx", len(model), model), ("weights.bin", data_bytes, None)):
            info = tarfile.TarInfo(name)
            info.size = size
            stream.write(info.tobuf(tarfile.USTAR_FORMAT))
            if content is not None:
                stream.write(content)
            else:
                stream.seek(size, os.SEEK_CUR)
            stream.write(bytes(-size % 512))
        stream.write(bytes(1024))


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {field}")


@pytest.mark.models
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc peak-RSS reset")
def test_a_300_mb_archive_upload_grows_the_api_by_less_than_100_mb(tmp_path):
    model = model_with_external_data(tmp_path / "model").read_bytes()
    archive = tmp_path / "big.tar"
    sparse_tar(archive, model, DATA_BYTES)
    try:
        with Server(tmp_path / "data", max_upload_mb=400, engine=FAKE_ENGINE) as server:
            pid = server.process.pid
            server.client.get("/readyz")  # warm: the first request's imports are not the upload's
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            before = memory_kib(pid, "VmRSS") << 10
            with open(archive, "rb") as stream:
                response = server.client.post("/optimize", files={"model": ("big.tar", stream)},
                                              data={"places": "x86/fp32/nchw"}, timeout=300)
            peak = memory_kib(pid, "VmHWM") << 10
            assert response.status_code == 202, response.text
            assert response.json()["input"]["bytes"] == archive.stat().st_size
            growth = peak - before
            print(f"API RSS before {before >> 20} MiB, peak during the upload {peak >> 20} MiB, "
                  f"growth {growth / (1 << 20):.1f} MiB for a {archive.stat().st_size >> 20} MiB upload")
            assert growth < GROWTH_LIMIT
            job = server.wait_for(response.json()["id"], timeout=300)
            assert job["status"] == "succeeded", job["error"]
    finally:
        archive.unlink(missing_ok=True)
