"""The engine CLI: the done-when run at opt level 0 on every real model, the listing, every error."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

from tests.conftest import CORPUS, LIGHT, all_models, model_id, random_feeds, run_onnxruntime, shapes_for
from worker.engine.cli import main


def shape_args(path) -> list[str]:
    args = []
    for name, dims in shapes_for(path).items():
        args += ["--input-shape", f"{name}={','.join(map(str, dims))}"]
    return args


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_opt_level_0_writes_a_valid_bit_identical_model(path, tmp_path, capsys):
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    code = main(["optimize", str(path), "-o", str(out), "--opt-level", "0", "--report", str(report)]
                + shape_args(path))
    assert code == 0, capsys.readouterr().err
    onnx.checker.check_model(str(out))
    feeds = random_feeds(path, shapes_for(path), seed=1)
    for expected, actual in zip(run_onnxruntime(path, feeds), run_onnxruntime(out, feeds)):
        np.testing.assert_array_equal(actual, expected)
    data = json.loads(report.read_text())
    assert data["verification"]["passed"] is True
    assert data["model"]["input"]["nodes"] == data["model"]["output"]["nodes"] == len(onnx.load(str(path)).graph.node)
    entry = data["trace"][0]
    assert {"pass", "kind", "seconds", "skipped"} <= set(entry) and entry["pass"] == "type_inference"
    assert entry["static"] == entry["values"]


def test_passes_lists_every_registered_pass(capsys):
    assert main(["passes", "--json"]) == 0
    passes = json.loads(capsys.readouterr().out)["passes"]
    by_name = {p["name"]: p for p in passes}
    assert by_name["type_inference"] | {"description": ""} == {
        "name": "type_inference", "kind": "stmt", "description": "", "level": 0, "targets": None,
        "excluded_targets": [], "kernels": [], "portable": True, "origin": "built-in", "position": 1,
        "invalidates": [], "requires": ["order"], "peer": None}
    assert by_name["conv_bn_fuse"]["peer"] == "Paddle-Lite"
    assert main(["passes"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["POS", "NAME", "KIND", "LEVEL", "TARGETS", "PEER"]
    assert any(row.split()[1:2] == ["conv_bn_fuse"] and "Paddle-Lite" in row.split() for row in table)


RESNET = str(LIGHT / "light_resnet50.onnx")


@pytest.mark.parametrize("args, message", [
    (["/no/such/model.onnx"], "/no/such/model.onnx: no such file"),
    ([str(CORPUS / "README.md")], "not an ONNX model"),
    ([RESNET, "--places", "arm/fp17/nchw"], "bad precision 'fp17' in place 'arm/fp17/nchw'; allowed: fp32"),
    ([RESNET, "--places", "tpu"], "bad target 'tpu' in place 'tpu'; allowed: host, x86, arm"),
    ([RESNET, "--disable-pass", "conv_bnn_fuse"], "unknown pass 'conv_bnn_fuse'"),
    ([RESNET, "--input-shape", "data=1,3,224,224"], "input shape given for 'data', but the model's inputs are"),
    ([RESNET, "--input-shape", "gpu_0/data_0=1,3,225,224"], "dim 2 is 224 in the model, 225 given"),
    ([RESNET, "--input-shape", "gpu_0/data_0=1,x"], "dimensions must be integers"),
])
def test_each_error_is_one_line_and_a_nonzero_exit(args, message, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    code = main(["optimize", *args, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("mirserve: error: ") and message in err and err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unreadable_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "secret.onnx"
    path.write_bytes(b"x")

    def denied(file, *args, **kwargs):  # what open() raises without read permission (root reads anything)
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr("worker.engine.ir.serde.open", denied, raising=False)
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx")]) == 1
    assert f"{path}: cannot read (Permission denied)" in capsys.readouterr().err


def test_console_script_runs_as_a_program(tmp_path):
    out = tmp_path / "out.onnx"
    done = subprocess.run([sys.executable, "-m", "worker.engine.cli", "optimize", RESNET, "-o", str(out), "--no-verify"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert re.search(r"415 -> \d+ nodes", done.stdout) and "not verified" in done.stdout
    done = subprocess.run([sys.executable, "-m", "worker.engine.cli", "optimize", RESNET], capture_output=True, text=True)
    assert done.returncode == 2 and "-o/--output" in done.stderr  # a usage error


def test_a_long_fallback_list_is_cut_in_the_closing_lines_and_whole_in_the_report():
    """Mask R-CNN under fp16 keeps 308 nodes in fp32: the closing lines name 20 and say where the rest are."""
    from worker.engine.cli import LISTED, summary

    nodes = [{"node": f"n{i}", "op": "Conv", "place": "arm/fp32/nchw", "why": "off"} for i in range(LISTED + 5)]
    report = {"model": {"input": {"nodes": 3, "bytes": 10}, "output": {"path": "o.onnx", "nodes": 3, "bytes": 10}},
              "seconds": 1.0, "verification": {"passed": True, "runs": 1, "outputs": []},
              "precision_fallback": {"nodes": nodes, "runs": 4}}
    text = summary(report)
    assert f"so {LISTED + 5} node(s) compute in fp32" in text
    assert "  n0 (Conv) on arm/fp32/nchw: off" in text and f"  n{LISTED - 1} (Conv)" in text
    assert f"  n{LISTED} (Conv)" not in text
    assert text.endswith("... and 5 more (the report's precision_fallback.nodes lists every one)")
    report["precision_fallback"]["nodes"] = nodes[:3]
    assert "more" not in summary(report)
