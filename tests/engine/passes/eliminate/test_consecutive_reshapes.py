"""fuse_consecutive_reshapes: a Reshape after a view op reads the view's input; copies (0) are resolved."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_reshapes"]


def chain(first, s2, x_shape, out_shape, initializers=()):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), first, helper.make_node("Reshape", ["t", "s2"], ["u"]),
             helper.make_node("Neg", ["u"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape))],
                      [tensor("s2", np.array(s2, np.int64)), *initializers])


def test_reshape_reshape_becomes_one_with_a_symbolic_batch(tmp_path):
    first = helper.make_node("Reshape", ["a", "s1"], ["t"])
    model = chain(first, [0, 4, 6], ("n", 24), ("n", 4, 6), [tensor("s1", np.array([0, 2, 12], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Neg"]
    assert outcome.model.graph.nodes_of_type("Reshape")[0].input(0).name == "a"


def test_flatten_then_reshape_back_vanishes(tmp_path):
    first = helper.make_node("Flatten", ["a"], ["t"], axis=1)
    outcome = run(chain(first, [2, 3, 4], (2, 3, 4), (2, 3, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_copy_of_a_dim_only_the_middle_tensor_has_is_resolved(tmp_path):
    first = helper.make_node("Unsqueeze", ["a", "axes"], ["t"])
    model = chain(first, [0, 0, 12], (2, 12), (1, 2, 12), [tensor("axes", np.array([0], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Neg"]


def test_copy_of_an_unknown_dim_is_refused(tmp_path):
    first = helper.make_node("Reshape", ["a", "s1"], ["t"])
    model = chain(first, [0, -1], ("n", 24), ("m", "k"), [tensor("s1", np.array([-1, 12], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Reshape", "Neg"]
    assert outcome.refused(STEP[0], "copies a dim that is not known")
