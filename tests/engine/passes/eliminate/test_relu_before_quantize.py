"""eliminate_relu_before_quantize: a Relu / Clip that the QuantizeLinear's saturation repeats is dropped."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_relu_before_quantize"]
make = helper.make_node


def quantized_activation(act_nodes, *, q_type=TensorProto.UINT8, q_zero=0, q_scale=0.02, opset=17, inits=(),
                         extra_outputs=()):
    """x -> (act_nodes: x -> a) -> Q(q_scale, q_zero) -> y_q."""
    zero_dtype = np.uint8 if q_type == TensorProto.UINT8 else np.int8
    nodes = [*act_nodes, make("QuantizeLinear", ["a", "qs", "qz"], ["y_q"])]
    return make_model(nodes, [vinfo("x", shape=[2, 3, 8, 8])], [vinfo("y_q", q_type, [2, 3, 8, 8]), *extra_outputs],
                      [tensor("qs", np.array(q_scale, np.float32)), tensor("qz", np.array(q_zero, zero_dtype)),
                       *inits], opset=opset)


def feeds():
    # values well past both ends of the quantized range, and exact zeros
    x = np.random.default_rng(3).normal(0, 4, (2, 3, 8, 8)).astype(np.float32)
    x[0, 0, 0] = 0.0
    return {"x": x}


@pytest.mark.parametrize("act_nodes, q_type, q_zero, inits", [
    ([make("Relu", ["x"], ["a"])], TensorProto.UINT8, 0, []),
    ([make("Relu", ["x"], ["a"])], TensorProto.INT8, -128, []),
    # a ReLU6 whose upper bound lies past the highest quantized value (255 * 0.02 = 5.1)
    ([make("Clip", ["x", "lo", "hi"], ["a"])], TensorProto.UINT8, 0,
     [tensor("lo", np.array(0, np.float32)), tensor("hi", np.array(6, np.float32))]),
    ([make("Clip", ["x", "lo"], ["a"])], TensorProto.INT8, -100,
     [tensor("lo", np.array(-0.6, np.float32))]),  # at or below 0.02 * (-128 + 100) = -0.56
], ids=["relu-uint8", "relu-int8", "relu6", "clip-below"])
def test_a_clamp_the_quantize_saturation_repeats_is_dropped_exactly(tmp_path, act_nodes, q_type, q_zero, inits):
    model = quantized_activation(act_nodes, q_type=q_type, q_zero=q_zero, inits=inits)
    outcome = run(model, STEP, tmp_path, feeds=feeds(), rtol=0, atol=0)
    assert outcome.ops == ["QuantizeLinear"]
    assert outcome.model.graph.nodes_of_type("QuantizeLinear")[0].input(0).name == "x"


def test_a_relu_before_a_zero_point_above_the_lowest_value_stays(tmp_path):
    model = quantized_activation([make("Relu", ["x"], ["a"])], q_zero=10)
    outcome = run(model, STEP, tmp_path, feeds=feeds())
    assert outcome.ops == ["Relu", "QuantizeLinear"]
    assert outcome.refused("eliminate_relu_before_quantize", "inside the range the QuantizeLinear saturates to")


def test_a_clip_below_the_highest_quantized_value_stays(tmp_path):
    model = quantized_activation([make("Clip", ["x", "lo", "hi"], ["a"])],
                                 inits=[tensor("lo", np.array(0, np.float32)), tensor("hi", np.array(3, np.float32))])
    outcome = run(model, STEP, tmp_path, feeds=feeds())
    assert outcome.ops == ["Clip", "QuantizeLinear"]
    assert outcome.refused("eliminate_relu_before_quantize", "clamps to [0, 3]")


def test_a_clamp_read_elsewhere_stays(tmp_path):
    model = quantized_activation([make("Relu", ["x"], ["a"])], extra_outputs=[vinfo("a", shape=[2, 3, 8, 8])])
    outcome = run(model, STEP, tmp_path, feeds=feeds())
    assert outcome.ops == ["Relu", "QuantizeLinear"]


def test_bounds_known_only_at_run_time_are_refused(tmp_path):
    nodes = [make("ReduceMax", ["x"], ["hi"], keepdims=0), make("Clip", ["x", "lo", "hi"], ["a"])]
    model = quantized_activation(nodes, inits=[tensor("lo", np.array(0, np.float32))])
    outcome = run(model, STEP, tmp_path, feeds=feeds())
    assert "Clip" in outcome.ops
    assert outcome.refused("eliminate_relu_before_quantize", "bounds are not known offline")


def test_then_qlinear_fuse_makes_one_int8_conv_of_conv_relu(tmp_path):
    """The class the sweep found (torchvision's post-training quantized ResNet): DQ -> Conv -> Relu -> Q."""
    rng = np.random.default_rng(0)
    nodes = [make("DequantizeLinear", ["x_q", "xs", "xz"], ["x"]),
             make("DequantizeLinear", ["w_q", "ws", "wz"], ["w"]),
             make("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), make("Relu", ["c"], ["a"]),
             make("QuantizeLinear", ["a", "qs", "qz"], ["y_q"])]
    model = make_model(nodes, [vinfo("x_q", TensorProto.UINT8, [1, 3, 8, 8])],
                       [vinfo("y_q", TensorProto.UINT8, [1, 4, 8, 8])],
                       [tensor("xs", np.array(0.05, np.float32)), tensor("xz", np.array(128, np.uint8)),
                        tensor("w_q", rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)),
                        tensor("ws", np.array(0.01, np.float32)), tensor("wz", np.array(0, np.int8)),
                        tensor("qs", np.array(0.03, np.float32)), tensor("qz", np.array(0, np.uint8))])
    x_q = {"x_q": rng.integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)}
    outcome = run(model, [*STEP, "qlinear_fuse"], tmp_path, feeds=x_q, rtol=0, atol=0)
    assert outcome.ops == ["QLinearConv"]
