"""The README's client examples, run as written against ``mirserve serve``."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.conftest import CORPUS

REPO = Path(__file__).resolve().parents[2]


def readme_python_blocks() -> list[str]:
    """The python code blocks of the README's client section, in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python client and remote command line"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run_example(code: str, cwd: Path, server) -> subprocess.CompletedProcess:
    env = {**os.environ, "MIRSERVE_SERVER": server.url, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.models
def test_the_readme_examples_run_as_written(real_server, tmp_path):
    sync_example, async_example = readme_python_blocks()
    shutil.copy(CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx", tmp_path)

    done = run_example(sync_example, tmp_path, real_server)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # queued, then running with its pass as the polls catch it (a loaded machine may poll it queued again, or
    # running before its first pass reports)
    states = [line.split()[0] for line in lines[:-2]]
    assert states and states == sorted(states, key=("queued", "running").index), lines
    assert all(re.fullmatch(r"(queued|running) (None|\{'current_pass': '\w+', 'index': \d+, 'total': \d+\})", line)
               for line in lines[:-2]), lines
    assert re.fullmatch(r"succeeded \{'current_pass': '\w+', 'index': (\d+), 'total': \1\}", lines[-2])
    assert re.fullmatch(r"566 -> \d+ \{'arm/fp16/nhwc': \d+, .*\}", lines[-1])
    onnx.checker.check_model(str(tmp_path / "cls.opt.onnx"))

    done = run_example(async_example, tmp_path, real_server)
    assert done.returncode == 0, done.stderr
    onnx.checker.check_model(str(tmp_path / "cls.x86.onnx"))
