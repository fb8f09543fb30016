"""add_layer_norm_fuse: a residual Add and the LayerNormalization after it become mirserve.AddLayerNormalization
(WithSum where the sum is read again): the graph written is the Expected one, both runtimes compute what the
pair did, every refusal is a sentence, no place loses its nodes, and the op's MACs come from its body."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, parser

from tests.conftest import run_onnxruntime
from tests.engine.passes.mirserve_fuse.helpers import assert_same_results, assert_typed_by_onnx, refusals, run_passes
from worker.engine.api import optimize
from worker.engine.kernels.table import default_table
from worker.engine.memory.macs import count_macs
from worker.engine.options import OptimizeOptions

PASS = "add_layer_norm_fuse"
TRANSFORMERS = Path(__file__).resolve().parents[2] / "data" / "transformers"
HEAD = '<ir_version: 10, opset_import: ["" : 18, "mirserve" : 1]>'
WEIGHTS = ("<float[8] scale = {0.5, 1.0, 1.5, 2.0, 0.25, 0.75, 1.25, 1.75}, "
           "float[8] bias = {0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8}>")


def model(text: str, inputs: str = "float[2, 4, 8] a, float[2, 4, 8] b", outputs: str = "float[2, 4, 8] y",
          weights: str = WEIGHTS) -> onnx.ModelProto:
    return parser.parse_model(f"{HEAD} g ({inputs}) => ({outputs}) {weights} {{ {text} }}")


POST_NORM = "s = Add(a, b)\n y = LayerNormalization <axis = -1, epsilon = 0.001> (s, scale, bias)"
PRE_NORM = POST_NORM + "\n z = Add(s, y)"


def structure(graph) -> list[tuple]:
    """Every node as (domain, op, inputs, outputs, attributes): what Before/Expected compare."""
    return [(n.domain, n.op_type, list(n.input), list(n.output),
             {a.name: helper.get_attribute_value(a) for a in n.attribute}) for n in graph.node]


def fuse(tmp_path, proto, places="x86/fp32/nchw", **options):
    out, trace = run_passes(proto, tmp_path, [PASS], kernels=default_table(), places=places, **options)
    return onnx.load(str(out)), out, trace


def feeds(shape_a=(2, 4, 8), shape_b=(2, 4, 8)) -> dict:
    rng = np.random.default_rng(3)
    return {"a": rng.standard_normal(shape_a).astype(np.float32), "b": rng.standard_normal(shape_b).astype(np.float32)}


def assert_same(before: onnx.ModelProto, tmp_path, out: Path, inputs: dict) -> None:
    """onnxruntime computes exactly what the pair did (it inlines the body: the same two kernels); onnx.reference,
    with its own LayerNormalization, to float rounding."""
    onnx.save(before, str(tmp_path / "before.onnx"))
    for got, want in zip(run_onnxruntime(out, inputs), run_onnxruntime(tmp_path / "before.onnx", inputs)):
        np.testing.assert_array_equal(got, want)
    assert_same_results(tmp_path / "before.onnx", out, inputs, rtol=1e-6, atol=1e-6)


def test_a_post_norm_residual_becomes_one_op(tmp_path):
    before = model(POST_NORM)
    expected = model("y = mirserve.AddLayerNormalization <axis = -1, epsilon = 0.001, stash_type = 1> "
                     "(a, b, scale, bias)")
    written, out, _ = fuse(tmp_path, before)
    assert structure(written.graph) == structure(expected.graph)
    assert [f.name for f in written.functions] == ["AddLayerNormalization"]
    assert_typed_by_onnx(out)
    assert_same(before, tmp_path, out, feeds())


def test_a_pre_norm_residual_keeps_the_sum_as_a_second_output_where_the_add_was(tmp_path):
    before = model(PRE_NORM, outputs="float[2, 4, 8] z")
    expected = model("y, s = mirserve.AddLayerNormalizationWithSum <axis = -1, epsilon = 0.001, stash_type = 1> "
                     "(a, b, scale, bias)\n z = Add(s, y)", outputs="float[2, 4, 8] z")
    written, out, _ = fuse(tmp_path, before)
    assert structure(written.graph) == structure(expected.graph)
    assert_typed_by_onnx(out)
    assert_same(before, tmp_path, out, feeds())


def test_the_sum_as_a_graph_output_is_kept_too(tmp_path):
    before = model(POST_NORM, outputs="float[2, 4, 8] y, float[2, 4, 8] s")
    written, out, _ = fuse(tmp_path, before)
    assert [(n.op_type, list(n.output)) for n in written.graph.node] == [("AddLayerNormalizationWithSum", ["y", "s"])]
    assert_same(before, tmp_path, out, feeds())


def test_a_norm_without_bias_gets_a_zero_one_and_the_default_attributes(tmp_path):
    before = model("s = Add(b, a)\n y = LayerNormalization(s, scale)", weights="<float[8] scale = {1, 2, 3, 4, 5, 6, 7, 8}>")
    written, out, _ = fuse(tmp_path, before)
    (node,) = written.graph.node
    assert list(node.input[:3]) == ["b", "a", "scale"] and node.input[3].endswith("_zero_bias")
    bias = next(i for i in written.graph.initializer if i.name == node.input[3])
    assert onnx.numpy_helper.to_array(bias).tolist() == [0.0] * 8
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attributes == {"axis": -1, "epsilon": pytest.approx(1e-5), "stash_type": 1}
    assert_same(before, tmp_path, out, feeds())


def test_leading_unit_axes_are_no_broadcast(tmp_path):
    # GPT-2 adds [16, 32] and [1, 16, 32]: the same elements in the same order
    before = model(POST_NORM, inputs="float[4, 8] a, float[1, 4, 8] b", outputs="float[1, 4, 8] y")
    written, out, _ = fuse(tmp_path, before)
    assert [n.op_type for n in written.graph.node] == ["AddLayerNormalization"]
    assert_same(before, tmp_path, out, feeds((4, 8), (1, 4, 8)))


@pytest.mark.parametrize("text, inputs, reason", [
    (POST_NORM, "float[2, 4, 8] a, float[1, 4, 8] b",
     "the Add broadcasts [2, 4, 8] with [1, 4, 8]: the fused op adds two tensors of the norm's input shape"),
    (POST_NORM, "float[2, 4, 8] a, float[8] b",
     "the Add broadcasts [2, 4, 8] with [8]: the fused op adds two tensors of the norm's input shape"),
    ("s = Add(a, b)\n g = Mul(scale, scale)\n y = LayerNormalization(s, g, bias)\n z = Add(s, y)",
     "float[2, 4, 8] a, float[2, 4, 8] b",
     "the sum is read elsewhere, so the fused op would take the Add's place, but LayerNormalization "),
], ids=["batch_broadcast", "bias_like_broadcast", "computed_scale_with_the_sum_kept"])
def test_refusals_are_sentences_and_leave_the_pair(tmp_path, text, inputs, reason):
    outputs = "float[2, 4, 8] z" if "z =" in text else "float[2, 4, 8] y"
    written, _, trace = fuse(tmp_path, model(text, inputs=inputs, outputs=outputs))
    assert "LayerNormalization" in [n.op_type for n in written.graph.node]
    assert any(r.startswith(f"add_layer_norm: {reason}") for r in refusals(trace)), refusals(trace)


def test_a_norm_whose_mean_is_read_is_no_candidate(tmp_path):
    text = "s = Add(a, b)\n y, m = LayerNormalization(s, scale, bias)"
    written, _, _ = fuse(tmp_path, model(text, outputs="float[2, 4, 8] y, float[2, 4, 1] m"))
    assert [n.op_type for n in written.graph.node] == ["Add", "LayerNormalization"]


@pytest.mark.parametrize("places, fused", [
    ("arm/fp32/nchw", True),                      # ARM's derived fp32 kernel: as good as the pair's
    ("cuda/fp16/nchw,cuda/fp32/nchw", True),      # CUDA runs Add and LayerNormalization in fp16: so the op
    ("arm/fp16/nchw,arm/fp32/nchw", False),       # the Add runs in fp16, the op in fp32 at best
    ("opencl/fp16/nchw,arm/fp32/nchw", False),    # no OpenCL LayerNormalization: the Add would leave OpenCL
])
def test_placement_is_never_lost(tmp_path, places, fused):
    written, _, trace = fuse(tmp_path, model(POST_NORM), places=places)
    assert ([n.op_type for n in written.graph.node] == ["AddLayerNormalization"]) is fused
    if not fused:
        assert any("mirserve.AddLayerNormalization would run on arm/fp32/nchw at best, while Add" in r
                   and "lose placement" in r for r in refusals(trace)), refusals(trace)


@pytest.mark.parametrize("op, outputs", [("AddLayerNormalization", [(2, 4, 8)]),
                                         ("AddLayerNormalizationWithSum", [(2, 4, 8), (2, 4, 8)])])
def test_the_macs_of_the_op_are_its_bodys(op, outputs):
    """An Add and a normalization do no MACs: counted through the body (a missing body would give None)."""
    attributes = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}
    count, reason = count_macs(op, "mirserve", [(2, 4, 8), (2, 4, 8), (8,), (8,)], outputs, attributes, opset=18)
    assert (count, reason) == (0, None)


def mirserve_ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node if n.domain == "mirserve")


@pytest.mark.models
@pytest.mark.parametrize("name, expected", [
    ("bert.torchscript", {"AddLayerNormalization": 3}),     # post-norm: the embedding norm and two in the layer
    ("bert.dynamo", {"AddLayerNormalization": 3}),
    ("gpt2.torchscript", {"AddLayerNormalizationWithSum": 2, "AddLayerNormalization": 1}),  # pre-norm, then ln_f
    ("gpt2.dynamo", {"AddLayerNormalizationWithSum": 2, "AddLayerNormalization": 1}),
])
def test_transformer_exports_fuse_every_residual_norm_and_verify(tmp_path, name, expected):
    source = TRANSFORMERS / f"{name}.onnx"
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(verify_runs=2))
    assert report["verification"]["passed"], report["verification"]
    ops = mirserve_ops(tmp_path / "out.onnx")
    assert {op: ops[op] for op in expected} == expected
    written = Counter(n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node)
    assert written["LayerNormalization"] == 0
    without = optimize(source, tmp_path / "without.onnx", OptimizeOptions(disabled_passes=[PASS], verify=False))
    assert report["model"]["output"]["nodes"] == without["model"]["output"]["nodes"] - sum(expected.values())
