"""eliminate_qdq_around_data_movement: data movement between equal Q/DQ parameters runs on the 8-bit data."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_qdq_around_data_movement"]
U8 = TensorProto.UINT8
make = helper.make_node


def sandwich(op_nodes, out_shape, *, q_scale=0.05, q_zero=128, opset=17, inits=(), in_shape=(2, 3, 4, 4),
             extra_outputs=()):
    """x_q -> DQ -> (op_nodes: x -> y) -> Q -> y_q."""
    nodes = [make("DequantizeLinear", ["x_q", "s", "z"], ["x"]), *op_nodes,
             make("QuantizeLinear", ["y", "qs", "qz"], ["y_q"])]
    return make_model(nodes, [vinfo("x_q", U8, list(in_shape))],
                      [vinfo("y_q", U8, list(out_shape)), *extra_outputs],
                      [tensor("s", np.array(0.05, np.float32)), tensor("z", np.array(128, np.uint8)),
                       tensor("qs", np.array(q_scale, np.float32)), tensor("qz", np.array(q_zero, np.uint8)),
                       *inits], opset=opset)


def feeds():
    return {"x_q": np.random.default_rng(5).integers(0, 256, (2, 3, 4, 4)).astype(np.uint8)}


@pytest.mark.parametrize("op_nodes, out_shape, inits", [
    ([make("Reshape", ["x", "shape"], ["y"])], (2, 48), [tensor("shape", np.array([0, -1], np.int64))]),
    ([make("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], (2, 4, 4, 3), []),
    ([make("Flatten", ["x"], ["y"], axis=1)], (2, 48), []),
    ([make("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1])], (2, 3, 3, 3), []),
], ids=["reshape", "transpose", "flatten", "maxpool"])
def test_data_movement_runs_on_the_quantized_data_exactly(tmp_path, op_nodes, out_shape, inits):
    outcome = run(sandwich(op_nodes, out_shape, inits=inits), STEP, tmp_path, feeds=feeds(), rtol=0, atol=0)
    assert outcome.ops == [op_nodes[0].op_type]
    moved = outcome.model.graph.nodes_of_type(op_nodes[0].op_type)[0]
    assert moved.input(0).name == "x_q" and moved.output(0).name == "y_q"


def test_different_parameters_on_the_two_sides_are_refused(tmp_path):
    model = sandwich([make("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], (2, 4, 4, 3), q_scale=0.1)
    outcome = run(model, STEP, tmp_path, feeds=feeds())
    assert outcome.ops == ["DequantizeLinear", "Transpose", "QuantizeLinear"]
    assert outcome.refused("eliminate_qdq_around_data_movement", "scales or zero points on the two sides differ")


def test_maxpool_before_opset_12_is_refused(tmp_path):
    model = sandwich([make("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], (2, 3, 2, 2), opset=11)
    outcome = run(model, STEP, tmp_path, feeds=feeds())
    assert "DequantizeLinear" in outcome.ops
    assert outcome.refused("eliminate_qdq_around_data_movement", "from opset 12, the model has 11")


def test_a_float_result_that_is_a_graph_output_is_refused(tmp_path):
    model = sandwich([make("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], (2, 4, 4, 3),
                     extra_outputs=[vinfo("y", shape=[2, 4, 4, 3])])
    outcome = run(model, STEP, tmp_path, feeds=feeds())
    assert outcome.ops == ["DequantizeLinear", "Transpose", "QuantizeLinear"]
    assert outcome.refused("eliminate_qdq_around_data_movement", "the intermediate 'y' is also a graph output")


def test_a_dequantize_read_elsewhere_stays(tmp_path):
    nodes = [make("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1]), make("Relu", ["x"], ["r"])]
    model = sandwich(nodes, (2, 4, 4, 3), extra_outputs=[vinfo("r", shape=[2, 3, 4, 4])])
    outcome = run(model, STEP, tmp_path, feeds=feeds(), rtol=0, atol=0)
    assert sorted(outcome.ops) == ["DequantizeLinear", "Relu", "Transpose"]
