"""eliminate_pooling1x1: a 1x1 window with stride 1 and no pads goes; anything else stays."""
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_pooling1x1"]


def pool_model(op, out_shape=(1, 2, 4, 4), outputs=("b",), **attrs):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node(op, ["a"], list(outputs), **attrs),
             helper.make_node("Neg", ["b"], ["y"])]
    graph_outputs = [vinfo("y", shape=list(out_shape))]
    if len(outputs) > 1:
        graph_outputs.append(vinfo(outputs[1], TensorProto.INT64, list(out_shape)))
    return make_model(nodes, [vinfo("x", shape=[1, 2, 4, 4])], graph_outputs)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_1x1_pooling_is_removed(tmp_path, op):
    outcome = run(pool_model(op, kernel_shape=[1, 1], strides=[1, 1]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_larger_windows_and_strides_stay(tmp_path):
    cases = [dict(kernel_shape=[2, 2], out_shape=(1, 2, 3, 3)),
             dict(kernel_shape=[1, 1], strides=[2, 2], out_shape=(1, 2, 2, 2))]
    for i, case in enumerate(cases):
        outcome = run(pool_model("MaxPool", **case), STEP, tmp_path / str(i))
        assert "MaxPool" in outcome.ops


def test_used_indices_are_refused(tmp_path):
    outcome = run(pool_model("MaxPool", outputs=("b", "idx"), kernel_shape=[1, 1]), STEP, tmp_path)
    assert "MaxPool" in outcome.ops and outcome.refused("eliminate_pooling1x1", "the output 'idx' of MaxPool")
