"""eliminate_unit_reduce: a reduction over axes of one element is its input (a Squeeze without keepdims)."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_unit_reduce"]


def reduction(op, axes, keepdims, x_shape, out_shape, opset=18):
    """Relu -> op(axes) -> Neg (MobileViT-v2's separable attention sums its context over one patch in the last
    stage at 64x64)."""
    inputs, inits = ["a"], []
    if axes is not None:
        inputs.append("axes")
        inits.append(tensor("axes", np.array(axes, np.int64)))
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node(op, inputs, ["r"], keepdims=keepdims),
             helper.make_node("Neg", ["r"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape))], inits,
                      opset=opset)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_a_reduction_over_one_element_is_its_input(tmp_path, op):
    outcome = run(reduction(op, [-1], 1, (1, 8, 4, 1), (1, 8, 4, 1)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_without_keepdims_it_is_a_squeeze(tmp_path):
    outcome = run(reduction("ReduceSum", [1, 3], 0, (2, 1, 4, 1), (2, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Squeeze", "Neg"]


def test_more_elements_or_other_reductions_stay(tmp_path):
    assert run(reduction("ReduceSum", [2], 1, (1, 8, 4, 1), (1, 8, 1, 1)), STEP, tmp_path / "a").ops == \
        ["Relu", "ReduceSum", "Neg"]
    for op in ("ReduceL2", "ReduceLogSumExp"):  # |x| and log(exp(x)), which overflows for a large x
        assert run(reduction(op, [3], 1, (1, 8, 4, 1), (1, 8, 4, 1)), STEP, tmp_path / op).ops == \
            ["Relu", op, "Neg"]
    assert run(reduction("ReduceSum", None, 1, (1, 8, 4, 1), (1, 1, 1, 1)), STEP, tmp_path / "c").ops == \
        ["Relu", "ReduceSum", "Neg"]
