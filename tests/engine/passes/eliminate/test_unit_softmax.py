"""eliminate_unit_softmax: a Softmax over one element becomes ones (LogSoftmax zeros), and an attention over a
single token then reduces to its values."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_unit_softmax"]


def one_token_attention(op="Softmax", shape=(1, 1, 8), **attrs):
    """q = Relu(x), k = Neg(x), v = Sigmoid(x); y = op(q kT) v over x's single position (timm's efficientvit_m0
    at 64x64 attends over 1x1 positions in its last stage)."""
    nodes = [helper.make_node("Relu", ["x"], ["q"]), helper.make_node("Neg", ["x"], ["k"]),
             helper.make_node("Sigmoid", ["x"], ["v"]), helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node(op, ["s"], ["w"], **attrs),
             helper.make_node("MatMul", ["w", "v"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(shape))], [vinfo("y", shape=list(shape))])


def test_attention_over_one_token_keeps_only_its_values(tmp_path):
    outcome = run(one_token_attention(), [*STEP, "identity_scale_eliminate"], tmp_path)
    assert outcome.ops == ["Sigmoid"]


@pytest.mark.parametrize("op, value", [("Softmax", 1.0), ("LogSoftmax", 0.0), ("Hardmax", 1.0)])
def test_each_normalization_becomes_its_constant(tmp_path, op, value):
    outcome = run(one_token_attention(op), STEP, tmp_path)
    assert outcome.ops == ["Sigmoid", "MatMul"]
    weights = {i.name: numpy_helper.to_array(i) for i in outcome.saved().graph.initializer}
    assert weights["w"].shape == (1, 1, 1) and np.all(weights["w"] == value)


def test_the_axis_of_one_element_is_read_per_opset(tmp_path):
    """Softmax(axis=1) of a [2, 1, 3] tensor normalizes over one element from opset 13, over three (axes 1 and 2
    read as one) before it."""
    def model(opset):
        nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Softmax", ["a"], ["b"], axis=1),
                 helper.make_node("Neg", ["b"], ["y"])]
        return make_model(nodes, [vinfo("x", shape=[2, 1, 3])], [vinfo("y", shape=[2, 1, 3])], opset=opset)

    assert run(model(13), STEP, tmp_path / "13").ops == ["Neg"]
    assert "Softmax" in run(model(11), STEP, tmp_path / "11").ops


def test_a_graph_output_is_refused_and_more_elements_stay(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Softmax", ["a"], ["y"], axis=-1)]
    outcome = run(make_model(nodes, [vinfo("x", shape=[3, 1])], [vinfo("y", shape=[3, 1])]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Softmax"] and outcome.refused("eliminate_unit_softmax", "graph output")
    outcome = run(one_token_attention(shape=(1, 2, 8)), STEP, tmp_path / "two")
    assert "Softmax" in outcome.ops
