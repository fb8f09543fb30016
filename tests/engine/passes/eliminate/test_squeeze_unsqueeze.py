"""fuse_consecutive_squeezes: cancelling Squeeze/Unsqueeze pairs vanish; same-kind pairs merge (axes as an
attribute before opset 13, an input from it on)."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_squeezes"]


def pair(first, a1, second, a2, x_shape, out_shape, opset):
    def make(op, source, out, axes, tag):
        if opset >= 13:
            return helper.make_node(op, [source, tag], [out]), [tensor(tag, np.array(axes, np.int64))]
        return helper.make_node(op, [source], [out], axes=axes), []
    n1, i1 = make(first, "a", "t", a1, "ax1")
    n2, i2 = make(second, "t", "u", a2, "ax2")
    nodes = [helper.make_node("Relu", ["x"], ["a"]), n1, n2, helper.make_node("Neg", ["u"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape))], i1 + i2,
                      opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
def test_unsqueeze_then_squeeze_of_the_same_axes_vanishes(tmp_path, opset):
    outcome = run(pair("Unsqueeze", [0, -1], "Squeeze", [0, 3], ("n", 4), ("n", 4), opset), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_then_unsqueeze_at_the_same_place_vanishes(tmp_path, opset):
    outcome = run(pair("Squeeze", [1], "Unsqueeze", [1], (2, 1, 4), (2, 1, 4), opset), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


@pytest.mark.parametrize("opset", [11, 13])
def test_two_unsqueezes_merge(tmp_path, opset):
    outcome = run(pair("Unsqueeze", [0], "Unsqueeze", [2], (3, 4), (1, 3, 1, 4), opset), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Unsqueeze", "Neg"]


def test_two_squeezes_merge_and_a_moving_pair_stays(tmp_path):
    outcome = run(pair("Squeeze", [1], "Squeeze", [2], (2, 1, 3, 1), (2, 3), 13), STEP, tmp_path / "merge")
    assert outcome.ops == ["Relu", "Squeeze", "Neg"]
    outcome = run(pair("Squeeze", [1], "Unsqueeze", [0], (2, 1, 3), (1, 2, 3), 13), STEP, tmp_path / "moves")
    assert outcome.ops == ["Relu", "Squeeze", "Unsqueeze", "Neg"]


def test_cancelling_pair_between_graph_ends_is_refused(tmp_path):
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["t"]), helper.make_node("Squeeze", ["t", "ax"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[3])], [vinfo("y", shape=[3])],
                       [tensor("ax", np.array([0], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Unsqueeze", "Squeeze"] and outcome.refused(STEP[0], "graph output")


def test_squeeze_axes_fed_at_run_time_are_refused(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Squeeze", ["a", "ax1"], ["t"]),
             helper.make_node("Squeeze", ["t", "ax2"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[1, 3, 1]), vinfo("ax1", 7, [1]), vinfo("ax2", 7, [1])],
                       [vinfo("y", shape=["k"])], opset=13)
    outcome = run(model, STEP, tmp_path, check=False, typed=False)
    assert outcome.ops == ["Relu", "Squeeze", "Squeeze"]
    assert outcome.refused(STEP[0], "axes or the rank of the input are not known")
