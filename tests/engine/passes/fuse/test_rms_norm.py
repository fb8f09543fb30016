"""rms_norm_fuse: RMSNorm chains as the dynamo and TorchScript exporters write them become RMSNormalization at
opset 23+, checked against the chain on onnxruntime; each refusal is a sentence."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "rms_norm_fuse"
HIDDEN = 16


def rms_chain(*, square="pow", inverse="reciprocal", scale=True, opset=23, eps=1e-6, two=2.0, one=1.0,
              gamma=None, axes=(-1,), shape=(2, 5, HIDDEN)):
    """x [2, 5, 16] -> x * rsqrt(mean(x ^ 2, axes) + eps) [* gamma]."""
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]) if square == "pow"
             else helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["v"]), helper.make_node("Sqrt", ["v"], ["r"])]
    if inverse == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["r"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"])]
    elif inverse == "div_one":
        nodes += [helper.make_node("Div", ["one", "r"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"])]
    else:
        nodes.append(helper.make_node("Div", ["x", "r"], ["n"]))
    inits = [tensor("two", np.float32(two)), tensor("eps", np.float32(eps)), tensor("one", np.float32(one)),
             tensor("axes", np.array(axes, np.int64))]
    if scale:
        nodes.append(helper.make_node("Mul", ["gamma", "n"], ["y"], name="scale"))
        inits.append(tensor("gamma", floats(HIDDEN, seed=3) if gamma is None else gamma))
    else:
        nodes[-1].output[0] = "y"
    used = {i for node in nodes for i in node.input}
    inits = [t for t in inits if t.name in used]
    return inferred_model(nodes, [vinfo("x", shape=list(shape))], ["y"], inits, opset=opset)


@pytest.mark.parametrize("inverse", ["reciprocal", "div_one", "div"])
@pytest.mark.parametrize("square", ["pow", "mul"])
def test_chain_becomes_rms_normalization(tmp_path, square, inverse):
    out = optimize(tmp_path, rms_chain(square=square, inverse=inverse), [PASS])
    assert out.ops == ["RMSNormalization"]
    node = out.node("RMSNormalization")
    assert node.attr("axis") == 2 and node.attr("epsilon") == pytest.approx(1e-6)
    np.testing.assert_array_equal(node.input(1).constant_value(), floats(HIDDEN, seed=3))


def test_without_scale_the_scale_is_ones(tmp_path):
    out = optimize(tmp_path, rms_chain(scale=False), [PASS])
    assert out.ops == ["RMSNormalization"]
    np.testing.assert_array_equal(out.node("RMSNormalization").input(1).constant_value(), np.ones(HIDDEN))


def test_two_trailing_axes(tmp_path):
    out = optimize(tmp_path, rms_chain(axes=(1, 2), gamma=floats(5, HIDDEN, seed=4)), [PASS])
    assert out.ops == ["RMSNormalization"] and out.node("RMSNormalization").attr("axis") == 1


def test_opset_22_is_refused_pointing_at_target_opset(tmp_path):
    out = optimize(tmp_path, rms_chain(opset=22), [PASS])
    assert "RMSNormalization" not in out.ops
    assert out.refused("RMSNormalization needs opset 23, and the model imports opset 22 (raise it with "
                       "--target-opset 23)")


def test_raised_by_target_opset(tmp_path):
    out = optimize(tmp_path, rms_chain(opset=18), [PASS], target_opset=23)
    assert out.ops == ["RMSNormalization"]


def test_no_kernel_in_any_valid_place_is_refused(tmp_path):
    """npu's table (Paddle-Lite's support list) has no RMSNormalization: the chain stays."""
    out = optimize(tmp_path, rms_chain(), [PASS], places="npu/fp32/nchw", host_fallback=False)
    assert "RMSNormalization" not in out.ops
    assert out.refused("no valid place (npu) has a RMSNormalization kernel at opset 23")
    assert optimize(tmp_path, rms_chain(), [PASS], places="npu/fp32/nchw").ops == ["RMSNormalization"]  # host


def test_leading_axis_is_refused(tmp_path):
    out = optimize(tmp_path, rms_chain(axes=(1,), scale=False), [PASS])
    assert "RMSNormalization" not in out.ops and out.refused("does not average a trailing block of dims")


@pytest.mark.parametrize("change, message", [
    ({"two": 3.0}, "does not square (its exponent is not the constant 2)"),
    ({"inverse": "div_one", "one": 2.0}, "does not invert (its dividend is not the constant 1)"),
])
def test_wrong_constants_are_refused(tmp_path, change, message):
    out = optimize(tmp_path, rms_chain(**change), [PASS])
    assert "RMSNormalization" not in out.ops and out.refused(message)


def test_a_scale_along_other_dims_stays_a_mul_after_the_op(tmp_path):
    out = optimize(tmp_path, rms_chain(gamma=floats(5, 1, seed=5)), [PASS])
    assert out.ops == ["RMSNormalization", "Mul"]
    assert out.refused("the scale 'gamma' is not a constant that varies only along the normalized dims")
