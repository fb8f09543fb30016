"""eliminate_reshape_before_binaryop: a view that only adds/removes leading unit axes before a binary op is
skipped; one that changes the output rank or the alignment stays."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_reshape_before_binaryop"]


def model_with(view_nodes, x_shape, b_shape, out_shape, initializers=()):
    nodes = [helper.make_node("Relu", ["b"], ["bb"]), *view_nodes, helper.make_node("Add", ["x", "v"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape)), vinfo("b", shape=list(b_shape))],
                      [vinfo("y", shape=list(out_shape))], list(initializers))


def test_unsqueeze_of_leading_axes_is_skipped(tmp_path):
    view = [helper.make_node("Unsqueeze", ["bb", "axes"], ["v"])]
    model = model_with(view, ("n", 4, 8), (8,), ("n", 4, 8), [tensor("axes", np.array([0, 1], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Add"]
    assert outcome.model.graph.nodes_of_type("Add")[0].input(1).name == "bb"


def test_reshape_that_moves_axes_stays(tmp_path):
    view = [helper.make_node("Reshape", ["bb", "shape"], ["v"])]
    model = model_with(view, (2, 8, 1), (8,), (2, 8, 1), [tensor("shape", np.array([8, 1], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Add"]


def test_reshape_that_sets_the_output_rank_stays(tmp_path):
    view = [helper.make_node("Reshape", ["bb", "shape"], ["v"])]
    model = model_with(view, (4, 8), (8,), (1, 4, 8), [tensor("shape", np.array([1, 1, 8], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Add"]


def test_view_read_elsewhere_stays_while_the_add_skips_it(tmp_path):
    nodes = [helper.make_node("Relu", ["b"], ["bb"]), helper.make_node("Unsqueeze", ["bb", "axes"], ["v"]),
             helper.make_node("Add", ["x", "v"], ["y"]), helper.make_node("Neg", ["v"], ["z"])]
    model = make_model(nodes, [vinfo("x", shape=[4, 8]), vinfo("b", shape=[8])],
                       [vinfo("y", shape=[4, 8]), vinfo("z", shape=[1, 8])],
                       [tensor("axes", np.array([0], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Unsqueeze", "Add", "Neg"]
    assert outcome.model.graph.nodes_of_type("Add")[0].input(1).name == "bb"
