"""eliminate_nop_pad: zero pads go, as an attribute (opset < 11) or a constant input (opset >= 11)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_pad"]


def pad_model(pads, opset, pads_input=False, out_shape=(1, 2, 3, 3)):
    if opset >= 11:
        pad = helper.make_node("Pad", ["a", "pads"], ["b"], mode="constant")
        initializers = [] if pads_input else [tensor("pads", np.array(pads, dtype=np.int64))]
    else:
        pad, initializers = helper.make_node("Pad", ["a"], ["b"], pads=pads), []
    nodes = [helper.make_node("Relu", ["x"], ["a"]), pad, helper.make_node("Neg", ["b"], ["y"])]
    inputs = [vinfo("x", shape=[1, 2, 3, 3])] + ([vinfo("pads", TensorProto.INT64, [8])] if pads_input else [])
    return make_model(nodes, inputs, [vinfo("y", shape=list(out_shape))], initializers, opset=opset)


@pytest.mark.parametrize("opset", [10, 11, 18])
def test_zero_pads_are_removed_and_real_pads_stay(tmp_path, opset):
    outcome = run(pad_model([0] * 8, opset), STEP, tmp_path / "zero")
    assert outcome.ops == ["Relu", "Neg"]
    outcome = run(pad_model([0, 0, 1, 1, 0, 0, 1, 1], opset, out_shape=(1, 2, 5, 5)), STEP, tmp_path / "real")
    assert outcome.ops == ["Relu", "Pad", "Neg"]


def test_pads_fed_at_run_time_are_refused(tmp_path):
    outcome = run(pad_model(None, 13, pads_input=True), STEP, tmp_path, check=False)
    assert "Pad" in outcome.ops and outcome.refused("eliminate_nop_pad", "not known at optimization time")
