"""eliminate_common_subexpression: repeated nodes merge; different attributes, random ops and two graph
outputs do not."""
from onnx import helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_common_subexpression"]


def test_repeated_nodes_merge_in_cascade(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"], name="relu_again"),
             helper.make_node("Neg", ["a"], ["c"]), helper.make_node("Neg", ["b"], ["d"]),
             helper.make_node("Add", ["c", "d"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg", "Add"]
    add = outcome.model.graph.nodes_of_type("Add")[0]
    assert add.input(0) is add.input(1)
    assert [(d["from"], d["to"]) for d in outcome.details(STEP[0])] == [(["relu_again"], ["relu"]),
                                                                         (["neg__0"], ["neg"])]


def test_different_attributes_do_not_merge(tmp_path):
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=[0, 1]),
             helper.make_node("Transpose", ["x"], ["b"], perm=[1, 0]), helper.make_node("MatMul", ["a", "b"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[3, 3])], [vinfo("y", shape=[3, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Transpose", "Transpose", "MatMul"]


def test_random_draws_do_not_merge(tmp_path):
    nodes = [helper.make_node("RandomUniformLike", ["x"], ["a"]), helper.make_node("RandomUniformLike", ["x"], ["b"]),
             helper.make_node("Sub", ["a", "b"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])]), STEP, tmp_path, check=False)
    assert outcome.ops.count("RandomUniformLike") == 2


def test_repeat_that_is_a_graph_output_keeps_its_name(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Neg", ["a"], ["z"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2]), vinfo("z", shape=[2])]),
                  STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]
    assert [v.name for v in outcome.model.graph.outputs] == ["y", "z"]


def test_two_graph_outputs_are_refused(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["z"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2]), vinfo("z", shape=[2])]),
                  STEP, tmp_path)
    assert outcome.ops == ["Relu", "Relu"]
    assert outcome.refused("eliminate_common_subexpression", "both graph inputs or outputs")
