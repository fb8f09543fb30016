"""eliminate_nop_split: one-output Split goes; a Split with one used output becomes a Slice (opset-aware)."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_split"]


def test_single_output_split_is_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Split", ["a"], ["b"], axis=1),
             helper.make_node("Neg", ["b"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 6])], [vinfo("y", shape=[2, 6])]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


@pytest.mark.parametrize("opset", [9, 11, 13, 18])
def test_split_with_one_used_output_becomes_a_slice(tmp_path, opset):
    if opset >= 18:
        split = helper.make_node("Split", ["a"], ["p", "q", "r"], axis=1, num_outputs=3)
        initializers = []
    elif opset >= 13:
        split = helper.make_node("Split", ["a", "sizes"], ["p", "q", "r"], axis=1)
        initializers = [tensor("sizes", np.array([2, 2, 2], np.int64))]
    else:
        split, initializers = helper.make_node("Split", ["a"], ["p", "q", "r"], axis=1, split=[2, 2, 2]), []
    nodes = [helper.make_node("Relu", ["x"], ["a"]), split, helper.make_node("Neg", ["q"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 6])], [vinfo("y", shape=[2, 2])], initializers, opset=opset)
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Slice", "Neg"]
    assert outcome.model.graph.nodes_of_type("Slice")[0].output().name == "q"


def test_split_with_two_used_outputs_stays(tmp_path):
    nodes = [helper.make_node("Split", ["x"], ["p", "q"], axis=0, split=[1, 1]),
             helper.make_node("Add", ["p", "q"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[1])], opset=11), STEP, tmp_path)
    assert outcome.ops == ["Split", "Add"]


def test_split_sizes_unknown_is_refused(tmp_path):
    nodes = [helper.make_node("Split", ["x", "sizes"], ["p", "q"], axis=0), helper.make_node("Neg", ["q"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[4]), vinfo("sizes", 7, [2])], [vinfo("y", shape=["k"])],
                       opset=13)
    outcome = run(model, STEP, tmp_path, check=False, typed=False)
    assert "Split" in outcome.ops and outcome.refused("eliminate_nop_split", "sizes of its outputs")
