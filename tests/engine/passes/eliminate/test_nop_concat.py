"""eliminate_nop_concat: a Concat of one input (others empty along the axis) goes."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_concat"]


def test_single_input_concat_is_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Concat", ["a"], ["b"], axis=1),
             helper.make_node("Neg", ["b"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_concat_with_only_empty_partners_is_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Concat", ["a", "empty"], ["b"], axis=1),
             helper.make_node("Neg", ["b"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])],
                       [tensor("empty", np.zeros((2, 0), np.float32))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_a_real_concat_stays_and_a_graph_end_to_end_one_is_refused(tmp_path):
    nodes = [helper.make_node("Concat", ["x", "x"], ["y"], axis=0)]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[4])]), STEP, tmp_path / "a")
    assert outcome.ops == ["Concat"]
    nodes = [helper.make_node("Concat", ["x"], ["y"], axis=0)]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])]), STEP, tmp_path / "b")
    assert outcome.ops == ["Concat"] and outcome.refused("eliminate_nop_concat", "graph output")
