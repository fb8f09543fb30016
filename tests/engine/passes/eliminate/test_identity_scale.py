"""identity_scale_eliminate: x*1, 1*x, x/1, x+0, 0+x, x-0 go; 1/x, 0-x, broadcasting constants stay."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["identity_scale_eliminate"]


def scale_model(op, constant, constant_first=False, out_shape=(2, 3)):
    inputs = ["k", "a"] if constant_first else ["a", "k"]
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node(op, inputs, ["b"]),
             helper.make_node("Neg", ["b"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=list(out_shape))],
                      [tensor("k", np.asarray(constant, np.float32))])


@pytest.mark.parametrize("op, constant, first", [("Mul", 1.0, False), ("Mul", [1, 1, 1], True),
                                                 ("Div", [[1.0]], False), ("Add", 0.0, True),
                                                 ("Sub", np.zeros((2, 3)), False)])
def test_neutral_constants_are_removed(tmp_path, op, constant, first):
    outcome = run(scale_model(op, constant, first), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


@pytest.mark.parametrize("op, constant, first", [("Div", 1.0, True), ("Sub", 0.0, True), ("Mul", 2.0, False),
                                                 ("Add", [0.0, 0.0, 0.5], False)])
def test_other_constants_stay(tmp_path, op, constant, first):
    outcome = run(scale_model(op, constant, first), STEP, tmp_path)
    assert op in outcome.ops


def boolean_model(op, constant, out_shape=(2, 3)):
    """Not(Greater(x, 0)) op constant -> Not, the mask arithmetic of a TorchScript transformers export."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["a"]), helper.make_node(op, ["k", "a"], ["b"]),
             helper.make_node("Not", ["b"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", TensorProto.BOOL, list(out_shape))],
                      [tensor("k", np.asarray(constant, bool)), tensor("zero", np.float32(0))])


@pytest.mark.parametrize("op, constant", [("And", True), ("And", [[True]]), ("Or", [False, False, False])])
def test_and_with_true_and_or_with_false_are_removed(tmp_path, op, constant):
    outcome = run(boolean_model(op, constant), STEP, tmp_path)
    assert outcome.ops == ["Greater", "Not"]


@pytest.mark.parametrize("op, constant, out_shape", [("And", [True, False, True], (2, 3)), ("Or", True, (2, 3)),
                                                     ("And", [[[True]]], (1, 2, 3))])
def test_and_or_with_other_constants_or_a_larger_shape_stay(tmp_path, op, constant, out_shape):
    outcome = run(boolean_model(op, constant, out_shape), STEP, tmp_path)
    assert op in outcome.ops


def test_a_neutral_constant_that_broadcasts_to_a_larger_shape_is_refused(tmp_path):
    outcome = run(scale_model("Mul", np.ones((4, 2, 3)), out_shape=(4, 2, 3)), STEP, tmp_path)
    assert "Mul" in outcome.ops and outcome.refused("identity_scale_eliminate", "larger shape")


def matmul_model(constant, constant_first, x_shape, out_shape):
    inputs = ["k", "a"] if constant_first else ["a", "k"]
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("MatMul", inputs, ["b"]),
             helper.make_node("Neg", ["b"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape))],
                      [tensor("k", np.asarray(constant, np.float32))])


@pytest.mark.parametrize("constant, first, x_shape", [(np.ones((1, 1)), False, (2, 5, 1)),
                                                      (np.ones((1, 1, 1)), True, (1, 1, 6))])
def test_matmul_by_a_one_by_one_matrix_of_one_is_removed(tmp_path, constant, first, x_shape):
    """What an attention over a single token keeps of its weights (timm's efficientvit_m0 at 64x64)."""
    outcome = run(matmul_model(constant, first, x_shape, x_shape), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_matmul_by_ones_that_broadcast_the_batch_is_refused_and_other_matrices_stay(tmp_path):
    outcome = run(matmul_model(np.ones((3, 1, 1)), True, (1, 1, 6), (3, 1, 6)), STEP, tmp_path)
    assert "MatMul" in outcome.ops and outcome.refused("identity_scale_eliminate", "data's shape")
    for constant in (np.full((1, 1), 2.0), np.ones((1, 2))):
        outcome = run(matmul_model(constant, False, (2, 1), (2, constant.shape[1])), STEP, tmp_path / "other")
        assert "MatMul" in outcome.ops
