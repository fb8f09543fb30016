"""Every hostile model through ``mirserve optimize``: a clear refusal or a verified model, never a byte of the
planted secret in the output, the report or the terminal, never a raw control character, always in time."""
from __future__ import annotations

import json
import os
import time

import onnx
import pytest

from tests.hostile.conftest import CONTROL, assert_clean_refusal, case_params
from tests.hostile.corpus import REFUSED, VERIFIED
from worker.engine.cli import main

#: Each case's budget: verification may take its 10 s (--limit verify_seconds=10), the rest is quick.
BUDGET_SECONDS = 45


def test_the_corpus_has_at_least_60_cases_in_every_family(corpus):
    assert len(corpus.cases) >= 60
    families = {c.family for c in corpus.cases}
    assert families == {"external", "bomb", "structure", "tensor", "naming", "metadata"}
    assert {c.expect for c in corpus.cases} == {REFUSED, VERIFIED}


@pytest.mark.parametrize("case", case_params())
def test_a_hostile_model_is_refused_clearly_or_verified(corpus, case, tmp_path, monkeypatch, capsys):
    server = tmp_path / "cwd"  # the working directory holds a copy of the secret, as a server's holds its files
    server.mkdir()
    (server / "secret.bin").write_bytes(corpus.secret)
    monkeypatch.chdir(server)
    monkeypatch.setenv("HOME", str(server))
    out, report = tmp_path / "out" / "model.onnx", tmp_path / "out" / "report.json"
    out.parent.mkdir()
    started = time.monotonic()
    code = main(["optimize", str(case.path(corpus.models)), "-o", str(out), "--report", str(report),
                 "--limit", "verify_seconds=10"])
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert elapsed < BUDGET_SECONDS, f"{case.name} took {elapsed:.0f} s"
    for text in (captured.out, captured.err):
        assert corpus.secret.decode() not in text
        assert not CONTROL.search(text), text[:500]
    written = [p for p in out.parent.iterdir()]
    for path in written:
        assert corpus.secret not in path.read_bytes(), f"{path.name} holds the secret"
    if code != 0:
        assert code == 1 and not written, captured.err
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mirserve: error: "), captured.err
        assert_clean_refusal(case, lines[0][len("mirserve: error: "):])
        return
    assert case.expect == VERIFIED, f"{case.name} should have been refused, but was written: {captured.err}"
    assert json.loads(report.read_text())["verification"]["passed"] is True
    onnx.checker.check_model(onnx.load(str(out)))
    assert "warning" not in captured.err, captured.err


def test_an_unverifiable_model_is_written_only_when_asked(corpus, tmp_path, capsys):
    path = corpus.models / "name_duplicate_nodes.onnx"  # onnxruntime refuses two nodes of one name
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(path), "-o", str(out), "--quiet"]) == 1
    assert "cannot be verified, so it is not written" in capsys.readouterr().err and not out.exists()
    report = tmp_path / "report.json"
    assert main(["optimize", str(path), "-o", str(out), "--allow-unverified", "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert out.exists() and "not verified: onnxruntime cannot run the input model" in printed
    data = json.loads(report.read_text())
    assert data["verification"]["passed"] is None and data["summary"]["verification"]["passed"] is None


def test_an_unknown_op_named_with_terminal_escapes_is_printed_escaped(tmp_path, capsys):
    from onnx import TensorProto, helper

    node = helper.make_node("Frobnicate", ["x"], ["y"], name="\x1b[2J\x1b]0;owned\x07")
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "escape.onnx"
    onnx.save(model, str(path))
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx")]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J\\x1b]0;owned\\x07" in err


def test_the_corpus_script_writes_the_corpus(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tests.hostile.corpus", str(tmp_path / "corpus")],
                          capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))), timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "corpus").glob("*.onnx"))) >= 60
