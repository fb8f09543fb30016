"""The example plugin (examples/plugins/acme_npu.py): its fusion rule, its target (with kernels for a built-in
op) and pipeline, end to end."""
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
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

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
#: The built-in mirserve.MultiHeadAttention (transformer_domain_fuse) takes BERT's head splits into the
#: attention op itself; without it they stay Reshape + Transpose, the plugin's sites.
WITHOUT_ATTENTION = ["--disable-pass", "transformer_domain_fuse"]
REPO = Path(__file__).resolve().parents[3]
FUSED = ("mirserve", "SplitHeads")
#: The built-in fusion the plugin gives kernels on its target.
ADD_NORM = ("mirserve", "AddLayerNormalization")


@pytest.fixture
def example(monkeypatch):
    records = load_path(monkeypatch, EXAMPLES)
    assert [(r["origin"], r["status"]) for r in records] == [(PLUGIN, "loaded")]


def heads_model(opset=18, perm=(0, 2, 1, 3), shape=(2, 4, -1, 2), reshaped_also_output=False, shape_fed=False,
                allowzero=None):
    """y = Transpose(Reshape(x [2, 4, 8], shape), perm), the shape an initializer (or a graph input)."""
    zero = {} if allowzero is None else {"allowzero": allowzero}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["h"], **zero),
             helper.make_node("Transpose", ["h"], ["y"], perm=list(perm))]
    outputs = [vinfo("y", shape=[2, 2, 4, 2])] + ([vinfo("h", shape=[2, 4, 2, 2])] if reshaped_also_output else [])
    inputs = [vinfo("x", shape=[2, 4, 8])] + ([vinfo("shape", TensorProto.INT64, shape=[4])] if shape_fed else [])
    inits = [] if shape_fed else [tensor("shape", np.array(shape, dtype=np.int64))]
    return make_model(nodes, inputs, outputs, inits, opset=opset)


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
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 4, 8)).astype(np.float32)}
    for runtime in (run_onnxruntime, lambda path, feeds: ReferenceEvaluator(str(path)).run(None, feeds)):
        for expected, actual in zip(run_onnxruntime(before, feeds), runtime(after, feeds)):
            np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("opset", [14, 18, 21])
@pytest.mark.parametrize("allowzero", [None, 1])
def test_split_heads_fuse_rewrites_the_pattern_and_keeps_the_numbers(example, tmp_path, opset, allowzero):
    ops, entry, out = run_stage(tmp_path, heads_model(opset, allowzero=allowzero))
    assert ops == [FUSED]
    assert entry["rewrites"] == 1 and entry["plugins"] == [PLUGIN]
    detail = entry["details"][0]
    assert detail["rule"] == "split_heads_fuse" and detail["origin"] == PLUGIN and len(detail["from"]) == 2
    written = onnx.load(str(out))
    assert [(f.domain, f.name) for f in written.functions] == [FUSED]
    assert [i.name for i in written.graph.initializer] == []  # the shape went into the attribute
    node = written.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {"shape": [2, 4, -1, 2]}
    assert_same_outputs(tmp_path / "in.onnx", out)


@pytest.mark.parametrize("change", [{"perm": (0, 2, 3, 1)}, {"reshaped_also_output": True}, {"shape_fed": True},
                                    {"allowzero": 1, "shape": (2, 4, 0, 2)}],
                         ids=["other_permutation", "reshape_read_elsewhere", "shape_not_constant", "zero_means_zero"])
def test_split_heads_fuse_leaves_anything_else_alone(example, tmp_path, change):
    ops, entry, _ = run_stage(tmp_path, heads_model(**change))
    assert [op for _, op in ops] == ["Reshape", "Transpose"] and entry["rewrites"] == 0


@pytest.mark.parametrize("options, reason", [
    ({"opt_level": 1}, "needs opt level 2, the run asked for 1"),
    ({"portable": True}, "emits ops of the mirserve domain, and the run asked for portable (standard ONNX) output"),
    ({"places": "arm/fp32/nchw", "host_fallback": False},
     "needs a mirserve.SplitHeads kernel, which no valid target (arm) registers"),
], ids=["opt_level_1", "portable", "no_kernel_in_the_valid_places"])
def test_split_heads_fuse_is_a_level_2_non_portable_rewrite_bound_to_its_kernel(example, tmp_path, options, reason):
    ops, entry, _ = run_stage(tmp_path, heads_model(), **options)
    assert [op for _, op in ops] == ["Reshape", "Transpose"]
    assert entry["filters"][0]["skipped"] == reason


def split_heads_sites(path: Path) -> int:
    """Transposes with perm [0, 2, 1, 3] reading a Reshape to a constant four-entry shape that nothing else
    reads, counted on the ONNX protobuf."""
    graph = onnx.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    readers = Counter(name for node in graph.node for name in node.input)
    outputs = {o.name for o in graph.output}

    def is_site(node) -> bool:
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        reshape = producer.get(node.input[0])
        return (node.op_type == "Transpose" and perm == [0, 2, 1, 3] and reshape is not None
                and reshape.op_type == "Reshape" and constants.get(reshape.input[1], np.zeros(0)).size == 4
                and readers[node.input[0]] == 1 and node.input[0] not in outputs)
    return sum(1 for node in graph.node if is_site(node))


def optimize(tmp_path, name, *args) -> tuple[dict, Counter]:
    out, report = tmp_path / f"{name}.onnx", tmp_path / f"{name}.json"
    assert main(["optimize", str(BERT), "-o", str(out), *BERT_SHAPES, "--quiet", "--report", str(report), *args]) == 0
    return json.loads(report.read_text()), Counter((n.domain, n.op_type) for n in onnx.load(str(out)).graph.node)


def test_the_example_changes_what_mirserve_optimize_writes_for_bert(example, tmp_path):
    with_filter, ops = optimize(tmp_path, "with", *WITHOUT_ATTENTION)
    without, ops_without = optimize(tmp_path, "without", *WITHOUT_ATTENTION, "--disable-pass", "split_heads_fuse",
                                    "--no-verify")
    sites = split_heads_sites(tmp_path / "without.onnx")
    assert sites == 8  # the queries and the values of 4 layers (the keys are transposed another way)
    assert with_filter["verification"]["passed"] is True
    stage = next(e for e in with_filter["trace"] if e["pass"] == "filter_domain")
    assert stage["rewrites"] == sites and stage["plugins"] == [PLUGIN]
    assert ops[FUSED] == sites and ops[("", "Transpose")] == ops_without[("", "Transpose")] - sites
    assert with_filter["model"]["output"]["nodes"] == without["model"]["output"]["nodes"] - sites
    skipped = next(e for e in without["trace"] if e["pass"] == "filter_domain")["filters"][0]
    assert skipped == {"name": "split_heads_fuse", "origin": PLUGIN, "changes": 0, "priority": 350,
                       "binds": "Transpose", "skipped": "disabled by the user"}
    assert {"origin": PLUGIN, "status": "loaded"}.items() <= with_filter["plugins"][0].items()
    fused = [n for n in with_filter["kernels"]["nodes"] if n["op"] == "mirserve.SplitHeads"]
    assert {(n["kernel"], n["place"]) for n in fused} == {("x86:mirserve.SplitHeads:1-:fp32:nchw", "x86/fp32/nchw")}


def test_the_built_in_residual_norm_runs_on_the_made_up_target_with_casts_around_it(example, tmp_path):
    report, ops = optimize(tmp_path, "acme", "--places", "acme/fp16/nchw,x86/fp32/nchw")
    assert report["verification"]["passed"] is True and report["verification"]["rtol"] == 1e-2
    placed = Counter((n["op"], n["place"]) for n in report["kernels"]["nodes"] if n["place"].startswith("acme"))
    # every site but the last, whose result leaves the graph: copying it back to the host would cost more
    # than the NPU saves (the plugin's cost figures against x86's), so the plan keeps that one on x86; and
    # verification stores every fp16 value in fp16, as the device would: auto mixed precision may keep a
    # few more in fp32 (named in the report)
    kept = {n["node"] for n in (report.get("precision_fallback") or {}).get("nodes", [])}
    sites = ops[ADD_NORM]
    assert sites == 8 and len(kept) <= 2
    assert placed[("mirserve.AddLayerNormalization", "acme/fp16/nchw")] + len(kept) >= sites - 1
    assert placed[("mirserve.AddLayerNormalization", "acme/fp16/nchw")] <= sites - 1
    assert report["placement"]["cost"] <= report["placement"]["greedy_cost"]
    assert {op for op, _ in placed} <= {"mirserve.AddLayerNormalization", "mirserve.SplitHeads", "mirserve.io_copy",
                                        "mirserve.calib"}
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
                           *WITHOUT_ATTENTION, "--no-verify"], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    written = onnx.load(str(out))
    assert Counter((n.domain, n.op_type) for n in written.graph.node)[FUSED] == 8
    done = subprocess.run([sys.executable, "-m", "worker.engine.cli", "passes"], capture_output=True, text=True, env=env,
                          cwd=REPO)
    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["350", "split_heads_fuse", "Transpose"] and PLUGIN in line
               for line in lines)
    assert any(line.split()[:2] == ["acme_lean", PLUGIN] for line in lines)
    assert any(line.split()[:3] == ["loaded", "MIRSERVE_PLUGIN_PATH", PLUGIN] for line in lines)
