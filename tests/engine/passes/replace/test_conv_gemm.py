"""conv_gemm_replace: flattened 1x1 Conv on 1x1 maps -> Gemm, after global pooling or a fully connected op."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "conv_gemm_replace"


@pytest.mark.parametrize("opset,flatten", [(9, "Flatten"), (13, "Reshape")])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_after_global_pooling(tmp_path, opset, flatten, bias):
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("Conv", ["g", "w"] + (["b"] if bias else []), ["c"], name="conv"),
             helper.make_node(flatten, ["c"] + (["shape"] if flatten == "Reshape" else []), ["y"])]
    inits = [tensor("w", floats(6, 4, 1, 1)), tensor("b", floats(6, seed=2)),
             tensor("shape", np.array([1, -1], np.int64))]
    model = inferred_model(nodes, [vinfo("x", shape=[1, 4, 5, 5])], ["y"], inits, opset=opset)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["GlobalAveragePool", "Flatten", "Gemm"]
    assert out.node("Gemm").output().shape == (1, 6)


def test_conv_after_a_fully_connected_op(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w0"], ["f"], name="fc"),
             helper.make_node("Reshape", ["f", "to4d"], ["f4"]),
             helper.make_node("Conv", ["f4", "w"], ["c"], name="conv"),
             helper.make_node("Flatten", ["c"], ["y"])]
    inits = [tensor("w0", floats(3, 4)), tensor("to4d", np.array([2, 4, 1, 1], np.int64)),
             tensor("w", floats(6, 4, 1, 1))]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=[2, 3])], ["y"], inits), [PASS])
    assert out.ops == ["Gemm", "Gemm"] and set(out.model.graph.initializers) == {"w0", "w_matrix"}


def test_conv_without_flatten_or_on_a_larger_map_is_left(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    model = inferred_model(nodes, [vinfo("x", shape=[1, 4, 1, 1])], ["y"], [tensor("w", floats(6, 4, 1, 1))])
    assert optimize(tmp_path, model, [PASS]).ops == ["Conv"]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Flatten", ["c"], ["y"])]
    model = inferred_model(nodes, [vinfo("x", shape=[1, 4, 2, 1])], ["y"], [tensor("w", floats(6, 4, 1, 1))])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Conv", "Flatten"] and out.refused("is not known to be 1x1")
