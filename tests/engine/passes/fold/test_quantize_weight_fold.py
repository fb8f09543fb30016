"""quantize_weight_fold: QuantizeLinear of a constant becomes an int8 initializer, DequantizeLinear kept;
activations keep their Q/DQ; a graph output is never folded."""
import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.conftest import CORPUS, make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run
from worker.engine.numeric import verify

STEP = ["quantize_weight_fold"]


def qdq_conv(weight_output=False):
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    scale = (np.abs(w).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], axis=0),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"])]
    outputs = [vinfo("y", shape=[1, 4, 6, 6])] + ([vinfo("wq", TensorProto.INT8, [4, 3, 3, 3])] if weight_output else [])
    return make_model(nodes, [vinfo("x", shape=[1, 3, 8, 8])], outputs,
                      [tensor("w", w), tensor("ws", scale), tensor("wz", np.zeros(4, np.int8)),
                       tensor("xs", np.float32(0.01)), tensor("xz", np.uint8(128))])


def test_a_constant_weight_is_stored_quantized(tmp_path):
    outcome = run(qdq_conv(), STEP, tmp_path)
    assert outcome.ops == ["QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "Conv"]
    weight = outcome.model.graph.initializers["wq"]
    assert weight.const.dtype == np.int8 and weight.shape == (4, 3, 3, 3)
    assert outcome.rewrites("quantize_weight_fold") == 1


def test_activations_keep_their_quantize(tmp_path):
    outcome = run(qdq_conv(), STEP, tmp_path)
    remaining = outcome.model.graph.nodes_of_type("QuantizeLinear")
    assert [n.input(0).name for n in remaining] == ["x"]


def test_a_graph_output_is_not_folded(tmp_path):
    outcome = run(qdq_conv(weight_output=True), STEP, tmp_path)
    assert len(outcome.model.graph.nodes_of_type("QuantizeLinear")) == 2
    assert outcome.refused("quantize_weight_fold", "graph output")


def test_the_quantized_classifier_stays_quantized_and_exact(tmp_path):
    proto = onnx.load(str(CORPUS / "cls_qdq.onnx"))
    steps = ["constant_to_initializer", "quantize_weight_fold", "eliminate_deadend", "eliminate_unused_initializer"]
    outcome = run(proto, steps, tmp_path, shapes={"x": [1, 3, 48, 192]}, check=False)
    graph = outcome.model.graph
    dequantize = graph.nodes_of_type("DequantizeLinear")
    assert len(dequantize) == 326  # every DequantizeLinear stays
    assert len(graph.nodes_of_type("QuantizeLinear")) == 326 - outcome.rewrites("quantize_weight_fold") > 0
    assert all(d.input(0).producer is not None or d.input(0).const.dtype in (np.int8, np.uint8) for d in dequantize)
    assert outcome.after.stat().st_size < 0.5 * (CORPUS / "cls_qdq.onnx").stat().st_size
    report = verify(CORPUS / "cls_qdq.onnx", outcome.after, input_shapes={"x": [1, 3, 48, 192]}, runs=3)
    assert report["passed"] and report["outputs"][0]["max_abs_diff"] == 0.0
