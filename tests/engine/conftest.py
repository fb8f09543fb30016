"""Fixtures the engine's tests share."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def llama(tmp_path_factory) -> Path:
    """A 2-layer Llama-architecture decoder with random fp16 weights in external data (bench/make_llama.py)."""
    path = tmp_path_factory.mktemp("llama") / "llama.onnx"
    subprocess.run([sys.executable, str(REPO / "bench" / "make_llama.py"), str(path), "--layers", "2", "--hidden",
                    "256", "--heads", "8", "--kv-heads", "2", "--intermediate", "688", "--vocab", "1000"],
                   check=True, capture_output=True)
    return path
