"""The example plugin (examples/plugins/acme_npu.py): its fusion rule, its target and pipeline, end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import CORPUS, make_model, run_onnxruntime, tensor, vinfo
from tests.plugins.conftest import EXAMPLES, load_path
from worker.cli import main
from worker.errors import PlaceError
from worker.ir import load_model, save_model
from worker.ir.verify import VerifyInstrument
from worker.options import OptimizeOptions
from worker.passes import PassContext, PassManager
from worker.passes.pipelines import MEMORY, PLACE
from worker.places import parse_places

PLUGIN = str(EXAMPLES / "acme_npu.py")
CLS = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def example(monkeypatch):
    records = load_path(monkeypatch, EXAMPLES)
    assert [(r["origin"], r["status"]) for r in records] == [(PLUGIN, "loaded")]


def scalar(name, value):
    return tensor(name, np.array(value, np.float32))


def hardswish_model(opset=11, add=3.0, low=0.0, high=6.0, divisor=6.0, swap=False, other="x", extra_use=False):
    """y = Relu(other * Clip(x + add, low, high) / divisor), constants as initializers (attributes before 11)."""
    clip_inputs = ["a", "low", "high"] if opset >= 11 else ["a"]
    clip_attrs = {} if opset >= 11 else {"min": low, "max": high}
    nodes = [helper.make_node("Add", ["three", "x"] if swap else ["x", "three"], ["a"]),
             helper.make_node("Clip", clip_inputs, ["c"], **clip_attrs),
             helper.make_node("Mul", ["c", other] if swap else [other, "c"], ["m"]),
             helper.make_node("Div", ["m", "six"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    outputs = [vinfo("y", shape=[2, 8])]
    if extra_use:
        outputs.append(vinfo("c", shape=[2, 8]))
    inits = [scalar("three", add), scalar("six", divisor)] + \
        ([scalar("low", low), scalar("high", high)] if opset >= 11 else [])
    return make_model(nodes, [vinfo("x", shape=[2, 8]), vinfo("x2", shape=[2, 8])], outputs, inits, opset=opset)


def run_filter(tmp_path, proto) -> tuple[list[str], dict, Path]:
    """Run type inference and the PRE filter stage; returns the op types after, the stage's entry, the output."""
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, str(source))
    model = load_model(source)
    ctx = PassContext(model, OptimizeOptions(), parse_places())
    trace = PassManager(instruments=[VerifyInstrument()]).run(ctx, ["type_inference", "filter_pre"])
    save_model(model, out)
    return [n.op_type for n in model.graph], trace[-1], out


def assert_same_outputs(before, after):
    feeds = {"x": np.linspace(-8, 8, 16, dtype=np.float32).reshape(2, 8), "x2": np.ones((2, 8), np.float32)}
    for expected, actual in zip(run_onnxruntime(before, feeds), run_onnxruntime(after, feeds)):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("opset, fused", [
    (9, ["HardSigmoid", "Mul", "Relu"]),  # Clip bounds are attributes
    (11, ["HardSigmoid", "Mul", "Relu"]),  # Clip bounds are inputs
    (14, ["HardSwish", "Relu"]),  # HardSwish exists
])
@pytest.mark.parametrize("swap", [False, True], ids=["x_first", "x_second"])
def test_hardswish_clip_fuse_rewrites_the_pattern_and_keeps_the_numbers(example, tmp_path, opset, fused, swap):
    proto = hardswish_model(opset, swap=swap)
    ops, entry, out = run_filter(tmp_path, proto)
    assert ops == fused
    assert entry["rewrites"] == 1 and entry["plugins"] == [PLUGIN]
    detail = entry["details"][0]
    assert detail["rule"] == "hardswish_clip_fuse" and detail["origin"] == PLUGIN
    assert len(detail["from"]) == 4 and len(detail["to"]) == len(fused) - 1
    assert onnx.load(str(out)).graph.initializer == []  # the 3, 0, 6 and 6 went with the pattern
    tmp_in = tmp_path / "in.onnx"
    assert_same_outputs(tmp_in, out)


@pytest.mark.parametrize("change", [
    {"add": 2.0}, {"high": 5.0}, {"low": -1.0}, {"divisor": 3.0}, {"other": "x2"}, {"extra_use": True},
], ids=["add_2", "clip_max_5", "clip_min_-1", "div_3", "mul_by_another_tensor", "clip_output_also_used"])
def test_hardswish_clip_fuse_leaves_anything_else_alone(example, tmp_path, change):
    ops, entry, _ = run_filter(tmp_path, hardswish_model(11, **change))
    assert ops == ["Add", "Clip", "Mul", "Div", "Relu"] and entry["rewrites"] == 0


def hardswish_sites(path: Path) -> int:
    """Occurrences of x * Clip(x + 3, 0, 6) / 6 counted on the ONNX protobuf, independently of the plugin."""
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    count = 0
    for div in (n for n in graph.node if n.op_type == "Div"):
        mul = producer.get(div.input[0])
        clips = [producer.get(i) for i in (mul.input if mul is not None and mul.op_type == "Mul" else [])]
        for clip in (c for c in clips if c is not None and c.op_type == "Clip"):
            add = producer.get(clip.input[0])
            count += add is not None and add.op_type == "Add" and add.input[0] in mul.input
    return count


def optimize(tmp_path, name, *args) -> tuple[dict, Counter]:
    out, report = tmp_path / f"{name}.onnx", tmp_path / f"{name}.json"
    assert main(["optimize", str(CLS), "-o", str(out), "--input-shape", "x=1,3,48,192", "--quiet",
                 "--report", str(report), *args]) == 0
    return json.loads(report.read_text()), Counter(n.op_type for n in onnx.load(str(out)).graph.node)


def test_the_example_changes_what_mirserve_optimize_writes_for_pp_ocr(example, tmp_path):
    sites = hardswish_sites(CLS)
    assert sites == 18
    with_filter, ops = optimize(tmp_path, "with")
    without, ops_without = optimize(tmp_path, "without", "--disable-pass", "hardswish_clip_fuse")
    assert with_filter["verification"]["passed"] is True and without["verification"]["passed"] is True
    stage = next(e for e in with_filter["trace"] if e["pass"] == "filter_pre")
    assert stage["rewrites"] == sites and stage["plugins"] == [PLUGIN]
    assert ops["HardSigmoid"] == ops_without["HardSigmoid"] + sites
    assert with_filter["model"]["output"]["nodes"] < without["model"]["output"]["nodes"]
    skipped = next(e for e in without["trace"] if e["pass"] == "filter_pre")["filters"][0]
    assert skipped == {"name": "hardswish_clip_fuse", "origin": PLUGIN, "changes": 0, "priority": 110, "binds": "Div",
                       "skipped": "disabled by the user"}
    assert {"origin": PLUGIN, "status": "loaded"}.items() <= with_filter["plugins"][0].items()


def test_the_acme_lean_pipeline_chooses_its_passes_from_the_options(example, tmp_path):
    report, _ = optimize(tmp_path, "lean", "--pipeline", "acme_lean", "--no-verify")
    ran = list(dict.fromkeys(e["pass"] for e in report["trace"]))
    assert ran == ["type_inference", "filter_pre", "filter_simplify", "filter_domain", *PLACE, "filter_post", *MEMORY]
    assert report["pipeline"] == "acme_lean"
    report, _ = optimize(tmp_path, "lean0", "--pipeline", "acme_lean", "--no-verify", "--opt-level", "0")
    assert [e["pass"] for e in report["trace"]] == ["type_inference"]


def test_the_acme_target_exists_only_with_the_plugin(example):
    assert [str(p) for p in parse_places("acme/fp16/nchw,x86/fp32/nchw")][:2] == ["acme/fp16/nchw", "x86/fp32/nchw"]
    from worker.plugins.loader import PLUGINS
    PLUGINS.unload_all()
    with pytest.raises(PlaceError, match="bad target 'acme' in place 'acme/fp16/nchw'"):
        parse_places("acme/fp16/nchw")


def test_loaded_through_the_plugin_path_in_a_fresh_process(tmp_path):
    env = {**os.environ, "MIRSERVE_PLUGIN_PATH": str(EXAMPLES)}
    out = tmp_path / "out.onnx"
    done = subprocess.run([sys.executable, "-m", "worker.cli", "optimize", str(CLS), "-o", str(out),
                           "--input-shape", "x=1,3,48,192", "--no-verify"], capture_output=True, text=True, env=env,
                          cwd=REPO)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert Counter(n.op_type for n in onnx.load(str(out)).graph.node)["Clip"] == 0
    done = subprocess.run([sys.executable, "-m", "worker.cli", "passes"], capture_output=True, text=True, env=env,
                          cwd=REPO)
    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["110", "hardswish_clip_fuse", "Div"] and PLUGIN in line for line in lines)
    assert any(line.split()[:2] == ["acme_lean", PLUGIN] for line in lines)
    assert any(line.split()[:3] == ["loaded", "MIRSERVE_PLUGIN_PATH", PLUGIN] for line in lines)
