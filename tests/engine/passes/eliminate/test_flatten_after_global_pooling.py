"""eliminate_flatten_after_global_pooling: global pooling + Flatten/Reshape to [N, C] become one reduction
without the unit axes (axes an attribute before opset 18, an input from it on)."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_flatten_after_global_pooling"]


def pooled(pool, tail, opset, x_shape=("n", 8, 5, 5), out_shape=("n", 8), extra=()):
    nodes = [helper.make_node(pool, ["x"], ["p"]), *tail, helper.make_node("Relu", ["f"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape)), *extra],
                      [tensor("rows", np.array([0, -1], np.int64)), tensor("cols", np.array([-1, 8], np.int64))],
                      opset=opset)


@pytest.mark.parametrize("pool, reduce", [("GlobalAveragePool", "ReduceMean"), ("GlobalMaxPool", "ReduceMax")])
@pytest.mark.parametrize("opset", [13, 18])
def test_pool_and_flatten_become_one_reduction(tmp_path, pool, reduce, opset):
    outcome = run(pooled(pool, [helper.make_node("Flatten", ["p"], ["f"], axis=1)], opset), STEP, tmp_path,
                  shapes=None)
    assert outcome.ops == [reduce, "Relu"]


@pytest.mark.parametrize("target", ["rows", "cols"])
def test_pool_and_reshape_to_rows_become_one_reduction(tmp_path, target):
    outcome = run(pooled("GlobalAveragePool", [helper.make_node("Reshape", ["p", target], ["f"])], 17), STEP,
                  tmp_path)
    assert outcome.ops == ["ReduceMean", "Relu"]


def test_flatten_to_another_layout_is_refused(tmp_path):
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["f"], axis=2),
             helper.make_node("Relu", ["f"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 8, 5, 5])], [vinfo("y", shape=[16, 1])])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["GlobalAveragePool", "Flatten", "Relu"]
    assert outcome.refused(STEP[0], "does not reshape to [N, C]")


def test_pooled_tensor_with_other_readers_is_refused(tmp_path):
    tail = [helper.make_node("Flatten", ["p"], ["f"], axis=1)]
    model = pooled("GlobalAveragePool", tail, 17, extra=[vinfo("p", shape=["n", 8, 1, 1])])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops[0] == "GlobalAveragePool" and outcome.refused(STEP[0], "the intermediate 'p' is also")
