"""eliminate_if_with_const_cond: an If with a constant condition becomes the nodes of the branch it takes."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, run_onnxruntime, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_if_with_const_cond"]


def if_const(flag, then_nodes, then_out, else_nodes, else_out, then_initializers=(), outputs=("y",)):
    then_graph = helper.make_graph(then_nodes, "then", [], [vinfo(then_out, shape=[2, 3])], list(then_initializers))
    else_graph = helper.make_graph(else_nodes, "else", [], [vinfo(else_out, shape=[2, 3])])
    nodes = [helper.make_node("If", ["c"], ["r"], then_branch=then_graph, else_branch=else_graph)]
    nodes += [helper.make_node("Neg", ["r"], ["y"])] if outputs == ("y",) else []
    graph_outputs = [vinfo("y", shape=[2, 3])] if outputs == ("y",) else [vinfo("r", shape=[2, 3])]
    return make_model(nodes, [vinfo("x", shape=[2, 3])], graph_outputs, [tensor("c", np.array(flag))])


@pytest.mark.parametrize("flag, kept", [(True, "Relu"), (False, "Abs")])
def test_the_taken_branch_replaces_the_if_with_names_kept(tmp_path, flag, kept):
    then_nodes = [helper.make_node("Relu", ["x"], ["t"], name="then_relu")]
    else_nodes = [helper.make_node("Abs", ["x"], ["e"], name="else_abs")]
    outcome = run(if_const(flag, then_nodes, "t", else_nodes, "e"), STEP, tmp_path)
    assert outcome.ops == [kept, "Neg"]
    node = outcome.model.graph.nodes_of_type(kept)[0]
    assert node.name == ("then_relu" if flag else "else_abs")
    assert outcome.details(STEP[0])[0]["to"] == [node.name]


def test_branch_initializers_move_to_the_main_graph(tmp_path):
    then_nodes = [helper.make_node("Add", ["x", "k"], ["t"])]
    proto = if_const(True, then_nodes, "t", [helper.make_node("Abs", ["x"], ["e"])], "e",
                     then_initializers=[tensor("k", np.ones(3, np.float32))])
    outcome = run(proto, STEP, tmp_path)
    assert outcome.ops == ["Add", "Neg"] and "k" in outcome.model.graph.initializers


def test_a_branch_value_given_to_two_graph_outputs_gets_an_identity(tmp_path):
    then_graph = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                                   [vinfo("t", shape=[2, 3]), vinfo("t", shape=[2, 3])])
    else_graph = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                                   [vinfo("e", shape=[2, 3]), vinfo("e", shape=[2, 3])])
    node = helper.make_node("If", ["c"], ["r1", "r2"], then_branch=then_graph, else_branch=else_graph)
    model = make_model([node], [vinfo("x", shape=[2, 3])], [vinfo("r1", shape=[2, 3]), vinfo("r2", shape=[2, 3])],
                       [tensor("c", np.array(True))])
    # onnxruntime itself returns zeros for the second output of the input model (a branch listing one value
    # twice), so the result is checked against numpy instead.
    outcome = run(model, STEP, tmp_path, check=False)
    assert outcome.ops == ["Relu", "Identity"]
    assert [v.name for v in outcome.model.graph.outputs] == ["r1", "r2"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for result in run_onnxruntime(outcome.after, {"x": x}):
        np.testing.assert_array_equal(result, np.maximum(x, 0))


def test_an_if_on_a_condition_known_only_at_run_time_stays(tmp_path):
    then_graph = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vinfo("t", shape=[2])])
    else_graph = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [vinfo("e", shape=[2])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)],
                       [vinfo("c", TensorProto.BOOL, []), vinfo("x", shape=[2])], [vinfo("y", shape=[2])])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["If"]
