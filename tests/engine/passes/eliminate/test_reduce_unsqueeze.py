"""fuse_consecutive_reduce_unsqueeze: a reduction without its axes, then an Unsqueeze of them, keeps them."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_reduce_unsqueeze"]


def reduce_then_unsqueeze(op, axes, unsqueeze_axes, opset, out_shape, x_shape=(1, 4, 6)):
    """Relu -> op(axes, keepdims=0) -> Unsqueeze -> Neg (timm's ConViT divides its attention by
    attn.sum(-1).unsqueeze(-1))."""
    if opset >= 13:
        inits, unsqueeze = [tensor("u_axes", np.array(unsqueeze_axes, np.int64))], ["r", "u_axes"]
    else:
        inits, unsqueeze = [], ["r"]
    if opset >= (13 if op == "ReduceSum" else 18):
        inputs, attrs = (["a", "r_axes"] if axes is not None else ["a"]), {}
        inits += [tensor("r_axes", np.array(axes, np.int64))] if axes is not None else []
    else:
        inputs, attrs = ["a"], ({"axes": axes} if axes is not None else {})
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node(op, inputs, ["r"], keepdims=0, **attrs),
             helper.make_node("Unsqueeze", unsqueeze, ["u"], **({} if opset >= 13 else {"axes": unsqueeze_axes})),
             helper.make_node("Neg", ["u"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape))], inits,
                      opset=opset)


@pytest.mark.parametrize("op, opset", [("ReduceSum", 17), ("ReduceSum", 11), ("ReduceMean", 17),
                                       ("ReduceMax", 18)])
def test_the_pair_keeps_the_axes(tmp_path, op, opset):
    """Axes as attributes or inputs, as each op takes them at the opset."""
    outcome = run(reduce_then_unsqueeze(op, [-1], [2], opset, (1, 4, 1)), STEP, tmp_path)
    assert outcome.ops == ["Relu", op, "Neg"]
    assert outcome.model.graph.nodes_of_type(op)[0].attr("keepdims") == 1


def test_every_axis_reduced_when_none_given(tmp_path):
    outcome = run(reduce_then_unsqueeze("ReduceSum", None, [0, 1, 2], 17, (1, 1, 1)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "ReduceSum", "Neg"]


def test_other_axes_put_back_stay(tmp_path):
    outcome = run(reduce_then_unsqueeze("ReduceSum", [1], [2], 17, (1, 6, 1)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "ReduceSum", "Unsqueeze", "Neg"]
    assert outcome.refused(STEP[0], "puts back other axes than the reduction removed")
