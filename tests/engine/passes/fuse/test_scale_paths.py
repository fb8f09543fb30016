"""fold_scale_axis, travelling scalars: an attention scale absorbed backward, a Gelu's 0.5 forward."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "fold_scale_axis"


def attention_scores(scale_node):
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"]), helper.make_node("Add", ["bq", "q0"], ["q1"]),
             helper.make_node("Reshape", ["q1", "heads"], ["q2"]),
             helper.make_node("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["x", "wk"], ["k0"]), helper.make_node("Reshape", ["k0", "heads"], ["k1"]),
             helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), scale_node]
    inits = [tensor("wq", floats(8, 8)), tensor("bq", floats(8, seed=2)), tensor("wk", floats(8, 8, seed=3)),
             tensor("heads", np.array([2, 4, 2, 4], np.int64)), tensor("k", np.float32(0.125))]
    return inferred_model(nodes, [vinfo("x", shape=[2, 4, 8])], ["y"], inits)


def test_attention_scale_goes_into_the_query_weights_and_bias(tmp_path):
    out = optimize(tmp_path, attention_scores(helper.make_node("Mul", ["s", "k"], ["y"], name="scale")), [PASS])
    assert "Mul" not in out.ops and len(out.ops) == 8
    assert out.model.graph.outputs[0].name == "y"
    assert "k" not in out.model.graph.initializers


def test_division_by_a_scalar_travels_too(tmp_path):
    out = optimize(tmp_path, attention_scores(helper.make_node("Div", ["s", "k"], ["y"])), [PASS])
    assert "Div" not in out.ops


def test_gelu_half_goes_forward_into_the_next_matmul(tmp_path):
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["half", "a"], ["m"], name="half_mul"),
             helper.make_node("Mul", ["x", "m"], ["g"]), helper.make_node("MatMul", ["g", "w"], ["y"])]
    inits = [tensor("one", np.float32(1)), tensor("half", np.float32(0.5)), tensor("w", floats(8, 5))]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=[2, 8])], ["y"], inits), [PASS])
    assert out.ops == ["Erf", "Add", "Mul", "MatMul"]


def test_scale_whose_path_is_shared_is_refused(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Mul", ["h", "k"], ["y"], name="scale")]
    inits = [tensor("w", floats(8, 5)), tensor("k", np.float32(3.0))]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=[2, 8])], ["y", "r"], inits), [PASS])
    assert out.ops == ["MatMul", "Relu", "Mul"]
    assert out.refused("no Conv, Gemm or MatMul with constant weights is reachable backward from Mul 'scale'")
