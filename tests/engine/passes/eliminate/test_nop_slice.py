"""eliminate_nop_slice: a Slice over whole axes goes (attributes before opset 10, inputs after)."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_slice"]
BIG = 2**63 - 1


def slice_model(starts, ends, axes, opset, steps=None, x_shape=("n", 4, 6), out_shape=None):
    if opset >= 10:
        names = ["a", "starts", "ends", "axes"] + (["steps"] if steps else [])
        initializers = [tensor("starts", np.array(starts, np.int64)), tensor("ends", np.array(ends, np.int64)),
                        tensor("axes", np.array(axes, np.int64))]
        initializers += [tensor("steps", np.array(steps, np.int64))] if steps else []
        node = helper.make_node("Slice", names, ["b"])
    else:
        node, initializers = helper.make_node("Slice", ["a"], ["b"], starts=starts, ends=ends, axes=axes), []
    nodes = [helper.make_node("Relu", ["x"], ["a"]), node, helper.make_node("Neg", ["b"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape or x_shape))],
                      initializers, opset=opset)


@pytest.mark.parametrize("opset", [9, 13])
def test_full_slice_is_removed(tmp_path, opset):
    outcome = run(slice_model([0, 0], [BIG, 6], [0, 2], opset), STEP, tmp_path, shapes=None)
    assert outcome.ops == ["Relu", "Neg"]


def test_negative_start_covering_a_static_axis_is_removed(tmp_path):
    outcome = run(slice_model([-4], [4], [1], 13), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_cutting_or_stepping_slices_stay(tmp_path):
    outcome = run(slice_model([1], [4], [1], 13, out_shape=("n", 3, 6)), STEP, tmp_path / "cut")
    assert "Slice" in outcome.ops
    outcome = run(slice_model([0], [6], [2], 13, steps=[2], out_shape=("n", 4, 3)), STEP, tmp_path / "step")
    assert "Slice" in outcome.ops


def test_slice_bounds_fed_at_run_time_are_refused(tmp_path):
    nodes = [helper.make_node("Slice", ["x", "s", "e"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[4]), vinfo("s", 7, [1]), vinfo("e", 7, [1])],
                       [vinfo("y", shape=["k"])])
    outcome = run(model, STEP, tmp_path, check=False)
    assert outcome.refused("eliminate_nop_slice", "not known at optimization time")
