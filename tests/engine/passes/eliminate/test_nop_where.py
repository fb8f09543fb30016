"""eliminate_nop_where: a Where whose constant condition picks one operand everywhere is that operand."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_where"]


def where_model(condition, x_shape=("n", 4), y_shape=("n", 4)):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["y"], ["b"]),
             helper.make_node("Where", ["c", "a", "b"], ["w"]), helper.make_node("Sigmoid", ["w"], ["z"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape)), vinfo("y", shape=list(y_shape))],
                      [vinfo("z", shape=[None] * max(len(x_shape), len(y_shape)))],
                      [tensor("c", np.array(condition, bool))])


@pytest.mark.parametrize("condition, kept", [([True] * 4, "Relu"), ([False] * 4, "Neg"), ([[True]], "Relu")])
def test_a_condition_of_one_truth_value_leaves_the_operand_it_picks(tmp_path, condition, kept):
    outcome = run(where_model(condition), STEP, tmp_path)
    assert "Where" not in outcome.ops
    (sigmoid,) = outcome.model.graph.nodes_of_type("Sigmoid")
    assert sigmoid.input(0).producer.op_type == kept


def test_a_condition_that_picks_from_both_stays(tmp_path):
    outcome = run(where_model([True, False, True, False]), STEP, tmp_path)
    assert "Where" in outcome.ops and outcome.refusals("eliminate_nop_where") == {}


def test_a_picked_operand_the_other_broadcasts_stays(tmp_path):
    # x (4,) picked everywhere, but y (3, 4) makes the output (3, 4)
    outcome = run(where_model([True] * 4, x_shape=(4,), y_shape=(3, 4)), STEP, tmp_path)
    assert "Where" in outcome.ops
    assert outcome.refused("eliminate_nop_where", "broadcast the picked one to a larger shape")
