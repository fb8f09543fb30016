"""eliminate_flatten_after_innerproduct: Flatten(axis=1) of a Gemm output goes, whatever the batch."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_flatten_after_innerproduct"]


def gemm_model(axis):
    out = ["n", 4] if axis == 1 else [1, None]
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], transB=1), helper.make_node("Flatten", ["g"], ["f"], axis=axis),
             helper.make_node("Relu", ["f"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=["n", 3])], [vinfo("y", shape=out)],
                      [tensor("w", np.ones((4, 3), np.float32))])


def test_flatten_after_gemm_is_removed_with_a_symbolic_batch(tmp_path):
    outcome = run(gemm_model(1), STEP, tmp_path)
    assert outcome.ops == ["Gemm", "Relu"]


def test_flatten_from_axis_0_stays(tmp_path):
    outcome = run(gemm_model(0), STEP, tmp_path)
    assert outcome.ops == ["Gemm", "Flatten", "Relu"]


def test_flatten_after_gemm_into_a_graph_output_keeps_the_name(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], transB=1), helper.make_node("Flatten", ["g"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", 3])], [vinfo("y", shape=["n", 4])],
                       [tensor("w", np.ones((4, 3), np.float32))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Gemm"] and outcome.model.graph.outputs[0].name == "y"
