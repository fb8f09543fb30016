"""identity_dropout_eliminate: inference Dropout goes; training mode, unknown mode or a used mask keep it."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["identity_dropout_eliminate"]


def dropout_model(opset, mode=None, mask_used=False, mode_input=False, **attrs):
    inputs = ["a"]
    initializers = []
    if opset >= 12:
        initializers.append(tensor("ratio", np.array(0.5, dtype=np.float32)))
        inputs.append("ratio")
        if mode is not None:
            initializers.append(tensor("mode", np.array(mode)))
            inputs.append("mode")
        elif mode_input:
            inputs.append("mode")
    outputs = ["d", "mask"] if mask_used else ["d"]
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Dropout", inputs, outputs, **attrs),
             helper.make_node("Neg", ["d"], ["y"])]
    graph_inputs = [vinfo("x", shape=[2, 3])] + ([vinfo("mode", TensorProto.BOOL, [])] if mode_input else [])
    graph_outputs = [vinfo("y", shape=[2, 3])] + ([vinfo("mask", TensorProto.BOOL, [2, 3])] if mask_used else [])
    return make_model(nodes, graph_inputs, graph_outputs, initializers, opset=opset)


@pytest.mark.parametrize("opset, mode", [(9, None), (11, None), (12, None), (13, False)])
def test_inference_dropout_is_removed(tmp_path, opset, mode):
    outcome = run(dropout_model(opset, mode), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_training_mode_true_is_refused(tmp_path):
    outcome = run(dropout_model(13, True), STEP, tmp_path, check=False)
    assert "Dropout" in outcome.ops
    assert outcome.refused("identity_dropout_eliminate", "training_mode input is true")


def test_training_mode_fed_at_run_time_is_refused(tmp_path):
    outcome = run(dropout_model(13, mode_input=True), STEP, tmp_path, check=False)
    assert "Dropout" in outcome.ops
    assert outcome.refused("identity_dropout_eliminate", "not known at optimization time")


def test_used_mask_is_refused(tmp_path):
    outcome = run(dropout_model(13, False, mask_used=True), STEP, tmp_path)
    assert "Dropout" in outcome.ops
    assert outcome.refused("identity_dropout_eliminate", "the output 'mask' of Dropout")


def test_dropout_6_in_training_mode_is_refused(tmp_path):
    outcome = run(dropout_model(6), STEP, tmp_path / "train", check=False)
    assert "Dropout" in outcome.ops
    assert outcome.refused("identity_dropout_eliminate", "is_test is not set")
    outcome = run(dropout_model(6, is_test=1), STEP, tmp_path / "test", check=False)
    assert "Dropout" not in outcome.ops
