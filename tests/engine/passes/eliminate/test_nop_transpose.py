"""eliminate_nop_transpose: the identity permutation goes; a real one (or the default reversal) stays."""
from onnx import helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import body_of, both_conditions, if_model, run

STEP = ["eliminate_nop_transpose"]


def test_identity_permutation_is_removed_and_real_ones_stay(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["b"], perm=[0, 1, 2]),
             helper.make_node("Transpose", ["b"], ["c"], perm=[0, 2, 1]), helper.make_node("Transpose", ["c"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3, 4])], [vinfo("y", shape=[3, 4, 2])]), STEP,
                  tmp_path)
    assert outcome.ops == ["Relu", "Transpose", "Transpose"]


def test_default_permutation_of_a_vector_is_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[5])], [vinfo("y", shape=[5])]), STEP, tmp_path)
    assert outcome.ops == ["Relu"]


def test_identity_transpose_in_an_if_body_is_removed(tmp_path):
    then_nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=[0, 1])]
    outcome = both_conditions(if_model(then_nodes, "t", [helper.make_node("Neg", ["x"], ["e"])], "e"), STEP,
                              tmp_path)
    assert [n.op_type for n in body_of(outcome)] == ["Relu"]


def test_graph_input_to_graph_output_is_refused(tmp_path):
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Transpose"] and outcome.refused("eliminate_nop_transpose", "graph output")


def test_permutation_moving_only_unit_axes_is_removed(tmp_path):
    """An attention over one token transposes its [1, 1, 1] weights (timm's efficientvit_m0 at 64x64): moving
    axes of extent 1 changes neither the shape nor the order of the elements."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["b"], ["y"], perm=[0, 1, 3, 2])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 1, 1, 5])], [vinfo("y", shape=[2, 1, 5, 1])]), STEP,
                  tmp_path)
    assert outcome.ops == ["Relu", "Transpose"]  # the first moves two unit axes; the second moves the 5
