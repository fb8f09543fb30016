"""The CLI's memory flags: --memory-timeline draws the plan, --dim-bound bounds what shapes leave open."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from tests.conftest import CORPUS, make_model, save_proto, tensor
from worker.engine.cli import main

CLS = str(CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx")


@pytest.fixture
def symbolic_batch_model(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8])],
                       [helper.make_tensor_value_info("y", T.FLOAT, ["N", 2, 8, 8])],
                       [tensor("w", np.ones((4, 3, 1, 1), np.float32)),
                        tensor("w2", np.ones((2, 4, 1, 1), np.float32))])
    return str(save_proto(model, tmp_path / "symbolic.onnx"))


def test_memory_timeline_draws_every_arena_and_the_summary_names_the_figures(tmp_path, capsys):
    svg, report = tmp_path / "timeline.svg", tmp_path / "report.json"
    code = main(["optimize", CLS, "-o", str(tmp_path / "out.onnx"), "--input-shape", "x=1,3,48,192",
                 "--no-verify", "--memory-timeline", str(svg), "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0
    memory = json.loads(report.read_text())["memory"]
    (arena,) = memory["arenas"]
    root = ET.fromstring(svg.read_text())
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert any(t.startswith("peak ") and f"at step {arena['peak_step']} ({arena['peak_node']})" in t
               for t in texts)
    words = " ".join(out.split())  # table cells fold to the terminal's width
    assert "memory per space" in words and "Paddle-Lite-style plan" in words and f"MACs {memory['macs']['total']:,}" in words


def test_dim_bound_plans_a_symbolic_batch(symbolic_batch_model, tmp_path, capsys):
    report = tmp_path / "report.json"
    code = main(["optimize", symbolic_batch_model, "-o", str(tmp_path / "out.onnx"), "--no-verify",
                 "--dim-bound", "N=4", "--report", str(report)])
    assert code == 0, capsys.readouterr().err
    memory = json.loads(report.read_text())["memory"]
    assert [v["size"] for v in memory["arenas"][0]["values"]] == [4 * 4 * 8 * 8 * 4]  # c, with r in place
    assert memory["io_bytes"] == 4 * 3 * 64 * 4 + 4 * 2 * 64 * 4


def test_without_a_bound_a_symbolic_batch_is_planned_at_batch_1_with_its_formula(symbolic_batch_model, tmp_path,
                                                                                 capsys):
    report = tmp_path / "report.json"
    code = main(["optimize", symbolic_batch_model, "-o", str(tmp_path / "out.onnx"), "--no-verify",
                 "--report", str(report)])
    out = " ".join(capsys.readouterr().out.split())  # table cells fold to the terminal's width
    assert code == 0
    memory = json.loads(report.read_text())["memory"]
    assert memory["planned_at"] == {"dims": {"N": 1}, "shapes": {"x": [1, 3, 8, 8]}}
    assert [v["size"] for v in memory["arenas"][0]["values"]] == [4 * 8 * 8 * 4]
    assert "arena as a formula of the open dims 1024*N" in out


@pytest.mark.parametrize("args, message", [
    (["--dim-bound", "N"], "bad dim bound 'N': expected NAME=N"),
    (["--dim-bound", "N=x"], "bad dim bound 'N=x': N must be an integer"),
    (["--dim-bound", "N=0"], "bad dim bound 'N=0': N must be positive"),
    (["--dim-bound", "batch=2"], "dim bound given for 'batch', which is neither a symbolic dim nor a value"),
    (["--memory-timeline", "/no/such/dir/t.svg"], "/no/such/dir/t.svg: the directory /no/such/dir does not"),
    (["--memory-timeline", "t.svg", "--disable-pass", "memory_plan"], "--memory-timeline needs the memory_plan"),
])
def test_bad_memory_flags_are_one_line_errors_and_write_nothing(args, message, symbolic_batch_model, tmp_path,
                                                                 capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.onnx"
    code = main(["optimize", symbolic_batch_model, "-o", str(out), "--no-verify", *args])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("mirserve: error: ") and message in err and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "t.svg").exists()
