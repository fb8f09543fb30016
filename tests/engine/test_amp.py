"""Auto mixed precision: models that fail verification in fp16 come back verified with the fewest nodes in fp32."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, save_proto, tensor, vinfo
from tests.engine.passes.place.helpers import place_model
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.cli import build_parser, options_from_args
from worker.engine.errors import OptionsError, VerificationError
from worker.engine.ir import load_model, save_model
from worker.engine.numeric import FP16_ATOL, FP16_RTOL, verify
from worker.engine.passes.place.type_layout_cast import picked_name
from worker.engine.places import Precision

PLACES = "arm/fp16/nhwc,arm/fp32/nchw"
RNG = np.random.default_rng(3)


def softmax_over_large_logits():
    """Logits near 30000, where fp16's step is 16: in fp16 every logit rounds to the same value. The MatMuls
    around are large enough that the plan puts the whole chain in fp16; the Relu first is harmless there."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["mm"], name="matmul"),
             helper.make_node("Add", ["mm", "b"], ["logits"], name="bias"),
             helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "w2"], ["y"], name="project")]
    return make_model(nodes, [vinfo("x", shape=[64, 256])], [vinfo("y", shape=[64, 256])],
                      [tensor("w", (RNG.standard_normal((256, 256)) * 0.05).astype(np.float32)),
                       tensor("b", np.full(256, 30000.0, np.float32)),
                       tensor("w2", RNG.standard_normal((256, 256)).astype(np.float32))], opset=13)


def layernorm_with_large_variance():
    """A LayerNorm written out (opset 13) between two MatMuls, over values of ~1e3: their squares overflow
    fp16 (65504)."""
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="embed"),
             helper.make_node("Mul", ["h", "scale"], ["xs"], name="scale_up"),
             helper.make_node("ReduceMean", ["xs"], ["mean"], axes=[-1], name="mean"),
             helper.make_node("Sub", ["xs", "mean"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
             helper.make_node("Div", ["d", "std"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "gamma"], ["ng"], name="mul_gamma"),
             helper.make_node("Add", ["ng", "beta"], ["z"], name="add_beta"),
             helper.make_node("MatMul", ["z", "w1"], ["y"], name="project")]
    scalar = lambda name, v: tensor(name, np.array(v, np.float32))  # noqa: E731
    return make_model(nodes, [vinfo("x", shape=[64, 256])], [vinfo("y", shape=[64, 256])],
                      [tensor("w0", (RNG.standard_normal((256, 256)) * 0.1).astype(np.float32)),
                       scalar("scale", 3000.0), scalar("two", 2.0), scalar("eps", 1e-5),
                       tensor("gamma", RNG.standard_normal(256).astype(np.float32)),
                       tensor("beta", RNG.standard_normal(256).astype(np.float32)),
                       tensor("w1", (RNG.standard_normal((256, 256)) * 0.1).astype(np.float32))], opset=13)


MODELS = {"softmax": softmax_over_large_logits, "layernorm": layernorm_with_large_variance}


def verifies(tmp_path, source, pinned: set[str], name: str) -> bool:
    """The model placed with ``pinned`` nodes in fp32 verifies against ``source`` at fp16's tolerances."""
    ctx = _pinned(source, pinned)
    out = tmp_path / f"{name}.onnx"
    save_model(ctx.model, out)
    try:
        verify(str(source), str(out), rtol=FP16_RTOL, atol=FP16_ATOL)
        return True
    except VerificationError:
        return False


def _pinned(source, pinned):
    from worker.engine.kernels import default_table
    from worker.engine.passes import PassContext, PassManager, get_pipeline
    from worker.engine.places import parse_places

    options = OptimizeOptions(places=PLACES)
    ctx = PassContext(load_model(source), options, parse_places(PLACES), kernels=default_table(),
                      pinned_fp32=frozenset(pinned))
    PassManager().run(ctx, get_pipeline("default").steps_for(options))
    return ctx


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_fails_in_fp16_without_the_fallback(tmp_path, kind):
    source = save_proto(MODELS[kind](), tmp_path / "in.onnx")
    with pytest.raises(VerificationError, match="does not compute what the input computed"):
        optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES, precision_fallback=False))
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_fallback_verifies_with_the_fewest_nodes_in_fp32(tmp_path, kind):
    source = save_proto(MODELS[kind](), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    assert report["verification"]["passed"] is True
    fallback = report["precision_fallback"]
    assert "does not compute what the input computed" in fallback["failure"]
    pinned = {n["node"] for n in fallback["nodes"]}
    assert pinned and all(n["place"] == "arm/fp32/nchw" and n["why"] for n in fallback["nodes"])
    assert fallback["runs"] == len(fallback["steps"]) and fallback["steps"][-1]["passed"] is not None
    # the pinned nodes compute in fp32 in the written model (the plan may move neighbours with them, where the
    # casts around a lone fp32 node would cost more than fp16 saves)
    written = load_model(tmp_path / "out.onnx")
    places = {picked_name(n): n.metadata.get("mirserve.place") for n in written.graph}
    assert all(places[name] == "arm/fp32/nchw" for name in pinned)
    assert len(pinned) < fallback["ranked"]  # fewer than every node that computed in fp16
    # fewest: with any one of them back in fp16 the model does not verify
    for name in pinned:
        assert not verifies(tmp_path, source, pinned - {name}, f"without-{name}"), name
    # and the summary says so
    assert report["summary"]["precision_fallback"]["nodes"] == sorted(pinned)


def test_softmax_needs_its_logits_in_fp32_too(tmp_path):
    """Nothing after the logits can undo their rounding: the Gemm that computes them must be in fp32."""
    source = save_proto(softmax_over_large_logits(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    nodes = report["precision_fallback"]["nodes"]
    assert "Gemm" in {n["op"] for n in nodes}  # the logits' producer (MatMul + Add)


def test_pinned_nodes_take_no_fp16_kernel(tmp_path):
    source = save_proto(layernorm_with_large_variance(), tmp_path / "in.onnx")
    free = {n.name: n.pick.place.precision for n in place_model(source, PLACES, verify_ir=False).graph}
    assert free["add_beta"] is Precision.FP16 and free["sub"] is Precision.FP16
    pinned = {n.name: n.pick.place.precision for n in _pinned(source, {"add_beta", "sub"}).graph}
    assert pinned["add_beta"] is Precision.FP32 and pinned["sub"] is Precision.FP32
    assert pinned["project"] is Precision.FP16  # not pinned: as before


def test_a_model_that_verifies_in_fp16_has_no_fallback(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = make_model(nodes, [vinfo("x", shape=[2, 8])], [vinfo("y", shape=[2, 4])],
                       [tensor("w", (RNG.standard_normal((8, 4)) * 0.1).astype(np.float32))])
    report = optimize(save_proto(model, tmp_path / "in.onnx"), tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    assert report["verification"]["passed"] is True and "precision_fallback" not in report


def test_the_option_and_the_flag():
    assert OptimizeOptions().precision_fallback is True
    assert OptimizeOptions.from_dict({"precision_fallback": False}).precision_fallback is False
    with pytest.raises(OptionsError, match="precision_fallback"):
        OptimizeOptions.from_dict({"precision_fallback": "no"})
    parser, _ = build_parser()
    args = parser.parse_args(["optimize", "m.onnx", "-o", "o.onnx", "--no-precision-fallback"])
    assert options_from_args(args).precision_fallback is False
    args = parser.parse_args(["optimize", "m.onnx", "-o", "o.onnx"])
    assert options_from_args(args).precision_fallback is True
