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
from tests.engine.plugins.conftest import EXAMPLES, load_path
from worker.engine.cli import main
from worker.engine.errors import PlaceError
from worker.engine.ir import load_model, save_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.kernels import default_table
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.passes.pipelines import MEMORY, PLACE
from worker.engine.places import parse_places

PLUGIN = str(EXAMPLES / "acme_npu.py")
BERT = CORPUS / "bert_small_dyn.onnx"
BERT_SHAPES = ["--input-shape", "input_ids=2,64", "--input-shape", "attention_mask=2,64"]
REPO = Path(__file__).resolve().parents[3]
FUSED = ("mirserve", "SkipLayerNormalization")


@pytest.fixture
def example(monkeypatch):
    records = load_path(monkeypatch, EXAMPLES)
    assert [(r["origin"], r["status"]) for r in records] == [(PLUGIN, "loaded")]


def residual_norm_model(opset=18, bias=True, sum_also_output=False, mean_used=False, op="Add"):
    """y = LayerNormalization(x + r) over the last axis of [2, 4, 8], scale and bias as initializers."""
    norm_inputs = ["s", "scale", "bias"] if bias else ["s", "scale"]
    norm_outputs = ["y", "mean"] if mean_used else ["y"]
    nodes = [helper.make_node(op, ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", norm_inputs, norm_outputs, axis=-1, epsilon=1e-6)]
    outputs = [vinfo("y", shape=[2, 4, 8])]
    outputs += [vinfo("s", shape=[2, 4, 8])] if sum_also_output else []
    outputs += [vinfo("mean", shape=[2, 4, 1])] if mean_used else []
    rng = np.random.default_rng(0)
    inits = [tensor("scale", rng.random(8, dtype=np.float32) + 0.5)]
    inits += [tensor("bias", rng.random(8, dtype=np.float32))] if bias else []
    return make_model(nodes, [vinfo("x", shape=[2, 4, 8]), vinfo("r", shape=[2, 4, 8])], outputs, inits,
                      opset=opset)


def run_stage(tmp_path, proto, **options) -> tuple[list[tuple[str, str]], dict, Path]:
    """Type inference and the DOMAIN filter stage; returns the (domain, op) list after, the stage's entry, the file."""
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, str(source))
    model = load_model(source)
    opts = OptimizeOptions(**options)
    ctx = PassContext(model, opts, parse_places(opts.places, host_fallback=opts.host_fallback),
                      kernels=default_table())
    trace = PassManager(instruments=[VerifyInstrument()]).run(ctx, ["type_inference", "filter_domain"])
    save_model(model, out)
    return [(n.domain, n.op_type) for n in model.graph], trace[-1], out


def assert_same_outputs(before, after):
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal((2, 4, 8)).astype(np.float32) for name in ("x", "r")}
    for expected, actual in zip(run_onnxruntime(before, feeds), run_onnxruntime(after, feeds)):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("opset", [17, 18, 21])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_skip_layer_norm_fuse_rewrites_the_pattern_and_keeps_the_numbers(example, tmp_path, opset, bias):
    ops, entry, out = run_stage(tmp_path, residual_norm_model(opset, bias=bias))
    assert ops == [FUSED]
    assert entry["rewrites"] == 1 and entry["plugins"] == [PLUGIN]
    detail = entry["details"][0]
    assert detail["rule"] == "skip_layer_norm_fuse" and detail["origin"] == PLUGIN and len(detail["from"]) == 2
    written = onnx.load(str(out))
    assert [(f.domain, f.name) for f in written.functions] == [FUSED]
    node = written.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == pytest.approx(
        {"axis": -1, "epsilon": 1e-6, "stash_type": 1})
    assert len(node.input) == 4 and written.graph.output[0].name == "y"
    assert_same_outputs(tmp_path / "in.onnx", out)


@pytest.mark.parametrize("change", [{"sum_also_output": True}, {"mean_used": True}, {"op": "Sub"}],
                         ids=["sum_is_also_an_output", "norm_mean_is_used", "not_an_add"])
def test_skip_layer_norm_fuse_leaves_anything_else_alone(example, tmp_path, change):
    ops, entry, _ = run_stage(tmp_path, residual_norm_model(**change))
    assert [op for _, op in ops] == [change.get("op", "Add"), "LayerNormalization"] and entry["rewrites"] == 0


@pytest.mark.parametrize("options, reason", [
    ({"opt_level": 1}, "needs opt level 2, the run asked for 1"),
    ({"portable": True}, "emits ops of the mirserve domain, and the run asked for portable (standard ONNX) output"),
    ({"places": "arm/fp32/nchw", "host_fallback": False},
     "needs a mirserve.SkipLayerNormalization kernel, which no valid target (arm) registers"),
], ids=["opt_level_1", "portable", "no_kernel_in_the_valid_places"])
def test_skip_layer_norm_fuse_is_a_level_2_non_portable_rewrite_bound_to_its_kernel(example, tmp_path, options, reason):
    ops, entry, _ = run_stage(tmp_path, residual_norm_model(), **options)
    assert [op for _, op in ops] == ["Add", "LayerNormalization"]
    assert entry["filters"][0]["skipped"] == reason


def residual_norm_sites(path: Path) -> int:
    """LayerNormalization nodes reading an Add that nothing else reads, counted on the ONNX protobuf."""
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    readers = Counter(name for node in graph.node for name in node.input)
    outputs = {o.name for o in graph.output}
    return sum(1 for node in graph.node if node.op_type == "LayerNormalization"
               and producer.get(node.input[0]) is not None and producer[node.input[0]].op_type == "Add"
               and readers[node.input[0]] == 1 and node.input[0] not in outputs)


def optimize(tmp_path, name, *args) -> tuple[dict, Counter]:
    out, report = tmp_path / f"{name}.onnx", tmp_path / f"{name}.json"
    assert main(["optimize", str(BERT), "-o", str(out), *BERT_SHAPES, "--quiet", "--report", str(report), *args]) == 0
    return json.loads(report.read_text()), Counter((n.domain, n.op_type) for n in onnx.load(str(out)).graph.node)


def test_the_example_changes_what_mirserve_optimize_writes_for_bert(example, tmp_path):
    sites = residual_norm_sites(BERT)
    assert sites == 9  # the embedding norm and two per layer of 4
    with_filter, ops = optimize(tmp_path, "with")
    without, ops_without = optimize(tmp_path, "without", "--disable-pass", "skip_layer_norm_fuse", "--no-verify")
    assert with_filter["verification"]["passed"] is True
    stage = next(e for e in with_filter["trace"] if e["pass"] == "filter_domain")
    assert stage["rewrites"] == sites and stage["plugins"] == [PLUGIN]
    assert ops[FUSED] == sites and ops[("", "LayerNormalization")] == ops_without[("", "LayerNormalization")] - sites
    assert with_filter["model"]["output"]["nodes"] == without["model"]["output"]["nodes"] - sites
    skipped = next(e for e in without["trace"] if e["pass"] == "filter_domain")["filters"][0]
    assert skipped == {"name": "skip_layer_norm_fuse", "origin": PLUGIN, "changes": 0, "priority": 350,
                       "binds": "LayerNormalization", "skipped": "disabled by the user"}
    assert {"origin": PLUGIN, "status": "loaded"}.items() <= with_filter["plugins"][0].items()
    fused = [n for n in with_filter["kernels"]["nodes"] if n["op"] == "mirserve.SkipLayerNormalization"]
    assert {(n["kernel"], n["place"]) for n in fused} == {
        ("x86:mirserve.SkipLayerNormalization:1-:fp32:nchw", "x86/fp32/nchw")}


def test_the_fused_op_runs_on_the_made_up_target_with_casts_around_it(example, tmp_path):
    report, ops = optimize(tmp_path, "acme", "--places", "acme/fp16/nchw,x86/fp32/nchw")
    assert report["verification"]["passed"] is True and report["verification"]["rtol"] == 1e-2
    placed = Counter((n["op"], n["place"]) for n in report["kernels"]["nodes"] if n["place"].startswith("acme"))
    # every site but the last, whose result leaves the graph: copying it back to the host would cost more
    # than the NPU saves (the plugin's cost figures against x86's), so the plan keeps that one on x86; and
    # verification stores every fp16 value in fp16, as the device would: auto mixed precision may keep a
    # few more in fp32 (named in the report)
    kept = {n["node"] for n in (report.get("precision_fallback") or {}).get("nodes", [])}
    assert len(kept) <= 2
    assert placed[("mirserve.SkipLayerNormalization", "acme/fp16/nchw")] + len(kept) >= residual_norm_sites(BERT) - 1
    assert placed[("mirserve.SkipLayerNormalization", "acme/fp16/nchw")] <= residual_norm_sites(BERT) - 1
    assert report["placement"]["cost"] <= report["placement"]["greedy_cost"]
    assert {op for op, _ in placed} == {"mirserve.SkipLayerNormalization", "mirserve.io_copy", "mirserve.calib"}
    casts = report["kernels"]["casts"]
    copies = {(c["from"].split("/")[0], c["to"].split("/")[0]) for c in casts if c["cast"] == "io_copy"}
    assert ("x86", "acme") in copies and any(source == "acme" for source, _ in copies)
    assert {(c["from"].split("/")[1], c["to"].split("/")[1]) for c in casts if c["cast"] == "calib"} == {
        ("fp32", "fp16"), ("fp16", "fp32")}
    assert ops[("mirserve", "io_copy")] == report["kernels"]["counts"]["io_copy"] > 0


def test_the_acme_lean_pipeline_chooses_its_passes_from_the_options(example, tmp_path):
    report, _ = optimize(tmp_path, "lean", "--pipeline", "acme_lean", "--no-verify")
    ran = list(dict.fromkeys(e["pass"] for e in report["trace"]))
    assert ran == ["type_inference", "filter_pre", "filter_simplify", "filter_domain", *PLACE, "filter_post", *MEMORY]
    assert report["pipeline"] == "acme_lean"
    report, _ = optimize(tmp_path, "lean0", "--pipeline", "acme_lean", "--no-verify", "--opt-level", "0")
    assert [e["pass"] for e in report["trace"]] == ["type_inference"]


def test_the_acme_target_exists_only_with_the_plugin(example):
    assert [str(p) for p in parse_places("acme/fp16/nchw,x86/fp32/nchw")][:2] == ["acme/fp16/nchw", "x86/fp32/nchw"]
    from worker.engine.plugins.loader import PLUGINS
    PLUGINS.unload_all()
    with pytest.raises(PlaceError, match="bad target 'acme' in place 'acme/fp16/nchw'"):
        parse_places("acme/fp16/nchw")


def test_plugins_load_before_the_places_of_a_run_are_parsed(monkeypatch):
    """A job's engine process starts with nothing loaded; its first call must see the plugin's target."""
    from worker.engine.api import validate_options
    from worker.engine.plugins.loader import PLUGINS

    monkeypatch.setenv("MIRSERVE_PLUGIN_PATH", str(EXAMPLES))
    assert PLUGINS.records == []
    places = validate_options(OptimizeOptions(places="acme/fp16/nchw", pipeline="acme_lean"))
    assert str(places).startswith("acme/fp16/nchw,") and [r.origin for r in PLUGINS.records] == [PLUGIN]


def test_loaded_through_the_plugin_path_in_a_fresh_process(tmp_path):
    env = {**os.environ, "MIRSERVE_PLUGIN_PATH": str(EXAMPLES)}
    out = tmp_path / "out.onnx"
    done = subprocess.run([sys.executable, "-m", "worker.engine.cli", "optimize", str(BERT), "-o", str(out), *BERT_SHAPES,
                           "--no-verify"], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    written = onnx.load(str(out))
    assert Counter((n.domain, n.op_type) for n in written.graph.node)[FUSED] == residual_norm_sites(BERT)
    done = subprocess.run([sys.executable, "-m", "worker.engine.cli", "passes"], capture_output=True, text=True, env=env,
                          cwd=REPO)
    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["350", "skip_layer_norm_fuse", "LayerNormalization"] and PLUGIN in line
               for line in lines)
    assert any(line.split()[:2] == ["acme_lean", PLUGIN] for line in lines)
    assert any(line.split()[:3] == ["loaded", "MIRSERVE_PLUGIN_PATH", PLUGIN] for line in lines)
