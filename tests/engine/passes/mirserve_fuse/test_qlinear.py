"""qlinear_fuse: DequantizeLinear -> op -> QuantizeLinear becomes mirserve.QLinear<Op>, bit for bit, and each
reason a candidate keeps its Q/DQ form."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.conftest import CORPUS, CORPUS_SHAPES, make_model, run_onnxruntime, tensor, vinfo
from tests.engine.passes.mirserve_fuse.helpers import (Kernels, assert_typed_by_onnx, op_counts, refusals, run_passes,
                                         run_reference)
from worker.engine.api import optimize
from worker.engine.options import OptimizeOptions

make = helper.make_node
RNG = np.random.default_rng(11)
STEP = ["qlinear_fuse"]
U8 = TensorProto.UINT8


def scalar(name, value, dtype=np.float32):
    return tensor(name, np.array(value, dtype=dtype))


def dq(name, source, scale="s", zero="z"):
    return make("DequantizeLinear", [source, scale, zero], [name])


def q(name, source, scale="s", zero="z"):
    return make("QuantizeLinear", [source, scale, zero], [name])


def conv_model(*, bias=True, per_channel=True, opset=21):
    """x_q [1, 3, 6, 6] uint8 -> DQ -> Conv(DQ(w_q) per channel[, b]) -> Q -> y_q."""
    w = RNG.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8)
    w_scale = np.array([0.02, 0.03, 0.01, 0.05] if per_channel else 0.02, np.float32)
    inits = [tensor("w_q", w), tensor("w_s", w_scale), tensor("w_z", np.zeros(w_scale.shape, np.int8)),
             scalar("s", 0.05), scalar("z", 128, np.uint8), scalar("ys", 0.2), scalar("yz", 120, np.uint8)]
    conv_inputs = ["x", "w"] + (["b"] if bias else [])
    if bias:
        inits.append(tensor("b", RNG.standard_normal(4).astype(np.float32)))
    axis = {"axis": 0} if opset >= 13 else {}
    nodes = [dq("x", "x_q"), make("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], **axis),
             make("Conv", conv_inputs, ["y"], pads=[1, 1, 1, 1]), q("y_q", "y", "ys", "yz")]
    return make_model(nodes, [vinfo("x_q", U8, [1, 3, 6, 6])], [vinfo("y_q", U8, [1, 4, 6, 6])], inits,
                      opset=opset)


def binary_model(op="Add", *, extra_reader=False, out_dtype=U8, opset=21):
    """a_q, b_q -> DQ each -> op -> Q -> c_q (optionally a Relu also reading DQ(a_q))."""
    nodes = [dq("a", "a_q"), dq("b", "b_q"), make(op, ["a", "b"], ["c"]), q("c_q", "c", "cs", "cz")]
    outputs = [vinfo("c_q", out_dtype, [2, 8])]
    if extra_reader:
        nodes.append(make("Relu", ["a"], ["r"]))
        outputs.append(vinfo("r", shape=[2, 8]))
    zero = np.array(0, helper.tensor_dtype_to_np_dtype(out_dtype))
    inits = [scalar("s", 0.1), scalar("z", 128, np.uint8), scalar("cs", 0.15), tensor("cz", zero)]
    return make_model(nodes, [vinfo("a_q", U8, [2, 8]), vinfo("b_q", U8, [2, 8])], outputs, inits, opset=opset)


def feeds_for(model: onnx.ModelProto) -> dict:
    out = {}
    for info in model.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        out[info.name] = RNG.integers(0, 255, shape).astype(np.uint8)
    return out


def assert_bit_identical(before, after, feeds):
    """onnxruntime gives exactly the input model's results; so does onnx.reference (it inlines the body)."""
    expected = run_onnxruntime(before, feeds)
    for runtime in (run_onnxruntime, run_reference):
        for actual, wanted in zip(runtime(after, feeds), expected):
            np.testing.assert_array_equal(actual, wanted, err_msg=runtime.__name__)


def fuse(tmp_path, model, **kwargs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    output, trace = run_passes(model, tmp_path, STEP, **kwargs)
    return output, trace, op_counts(output)


# --- what fuses ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_conv_with_per_channel_weights_becomes_one_op_computing_the_same_bits(tmp_path, bias):
    model = conv_model(bias=bias)
    output, trace, counts = fuse(tmp_path, model)
    assert counts == {"mirserve.QLinearConv": 1}
    node = onnx.load(str(output)).graph.node[0]
    assert list(node.input[:8]) == ["x_q", "s", "z", "w_q", "w_s", "w_z", "ys", "yz"]
    assert list(node.input[8:]) == (["b"] if bias else [""])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"dilations": [1, 1], "group": 1, "pads": [1, 1, 1, 1], "strides": [1, 1]}
    assert_bit_identical(tmp_path / "in.onnx", output, feeds_for(model))
    assert_typed_by_onnx(output)
    detail = trace[-1]["details"][0]
    assert detail["rule"] == "QLinearConv" and len(detail["from"]) == 4  # both DQs, the Conv, the Q


def test_binary_op_without_zero_points_gets_one_shared_explicit_zero(tmp_path):
    nodes = [make("DequantizeLinear", ["a_q", "s"], ["a"]), make("DequantizeLinear", ["b_q", "s"], ["b"]),
             make("Mul", ["a", "b"], ["c"]), make("QuantizeLinear", ["c", "cs"], ["c_q"])]
    model = make_model(nodes, [vinfo("a_q", U8, [2, 8]), vinfo("b_q", U8, [2, 8])], [vinfo("c_q", U8, [2, 8])],
                       [scalar("s", 0.1), scalar("cs", 0.15)], opset=21)
    output, _, counts = fuse(tmp_path, model)
    assert counts == {"mirserve.QLinearMul": 1}
    node = onnx.load(str(output)).graph.node[0]
    assert node.input[2] == node.input[5] == node.input[7]  # one uint8 zero for all three
    assert_bit_identical(tmp_path / "in.onnx", output, feeds_for(model))


def test_a_dequantize_other_nodes_read_stays(tmp_path):
    model = binary_model(extra_reader=True)
    output, _, counts = fuse(tmp_path, model)
    assert counts == {"mirserve.QLinearAdd": 1, "DequantizeLinear": 1, "Relu": 1}
    assert_bit_identical(tmp_path / "in.onnx", output, feeds_for(model))


def test_softmax_over_the_last_axis_fuses_and_over_another_is_refused(tmp_path):
    def softmax_model(axis):
        nodes = [dq("x", "x_q"), make("Softmax", ["x"], ["y"], axis=axis), q("y_q", "y", "ys", "yz")]
        return make_model(nodes, [vinfo("x_q", U8, [2, 3, 5])], [vinfo("y_q", U8, [2, 3, 5])],
                          [scalar("s", 0.1), scalar("z", 128, np.uint8), scalar("ys", 1 / 256),
                           scalar("yz", 0, np.uint8)], opset=21)

    model = softmax_model(-1)
    output, _, counts = fuse(tmp_path / "last", model)
    assert counts == {"mirserve.QLinearSoftmax": 1}
    assert_bit_identical(tmp_path / "last" / "in.onnx", output, feeds_for(model))
    _, trace, counts = fuse(tmp_path / "middle", softmax_model(1))
    assert counts["Softmax"] == 1
    assert refusals(trace) == ["QLinearSoftmax: it is a softmax over another axis than the last; "
                               "QLinearSoftmax is over the last"]


def test_opset_13_body_without_axis_support_below_it(tmp_path):
    """Below opset 13 DequantizeLinear has no axis: a per-channel weight is refused, a per-tensor one fuses."""
    _, trace, counts = fuse(tmp_path / "pc", conv_model(per_channel=True, opset=11))
    assert counts["Conv"] == 1
    assert any("per axis" in r for r in refusals(trace))
    model = conv_model(per_channel=False, opset=11)
    output, _, counts = fuse(tmp_path / "pt", model)
    assert counts == {"mirserve.QLinearConv": 1}
    np.testing.assert_array_equal(run_onnxruntime(output, feeds := feeds_for(model))[0],
                                  run_onnxruntime(tmp_path / "pt" / "in.onnx", feeds)[0])


# --- refusals ------------------------------------------------------------------------------------------
def test_float_result_read_by_another_node_is_refused(tmp_path):
    model = binary_model()
    model.graph.node.append(make("Relu", ["c"], ["r"]))
    model.graph.output.append(vinfo("r", shape=[2, 8]))
    _, trace, counts = fuse(tmp_path, model)
    assert counts["Add"] == 1
    assert refusals(trace) == ["QLinearAdd: the intermediate 'c' is also read by Relu 'relu'"]


def test_quantizing_to_16_bits_is_refused(tmp_path):
    _, trace, counts = fuse(tmp_path, binary_model(out_dtype=TensorProto.UINT16))
    assert counts["Add"] == 1
    assert refusals(trace) == ["QLinearAdd: its result is quantized to uint16, not to 8 bits"]


def test_per_axis_activation_scale_is_refused(tmp_path):
    model = binary_model()
    model.graph.initializer.append(tensor("s8", np.full(8, 0.1, np.float32)))
    model.graph.initializer.append(tensor("z8", np.full(8, 128, np.uint8)))
    model.graph.node[0].CopyFrom(make("DequantizeLinear", ["a_q", "s8", "z8"], ["a"], axis=1))
    _, trace, counts = fuse(tmp_path, model)
    assert counts["Add"] == 1
    assert refusals(trace) == ["QLinearAdd: a DequantizeLinear is per axis where the quantized form takes a "
                               "per-tensor scale"]


def test_an_operand_that_is_not_dequantized_is_refused(tmp_path):
    nodes = [dq("a", "a_q"), make("Add", ["a", "k"], ["c"]), q("c_q", "c", "cs", "cz")]
    model = make_model(nodes, [vinfo("a_q", U8, [2, 8])], [vinfo("c_q", U8, [2, 8])],
                       [scalar("s", 0.1), scalar("z", 128, np.uint8), scalar("cs", 0.15), scalar("cz", 0, np.uint8),
                        tensor("k", np.ones((2, 8), np.float32))], opset=21)
    _, trace, counts = fuse(tmp_path, model)
    assert counts["Add"] == 1
    assert refusals(trace) == ["QLinearAdd: an operand is not the output of a DequantizeLinear"]


def test_only_a_kernel_on_a_place_the_user_gave_makes_it_worth_emitting(tmp_path):
    kernels = Kernels(("QLinearAdd", "mirserve", "x86"), ("QLinearAdd", "mirserve", "host"))
    _, trace, counts = fuse(tmp_path / "arm", binary_model(), kernels=kernels, places="arm/int8/nchw")
    assert counts["Add"] == 1
    assert refusals(trace) == ["QLinearAdd: no place given (arm) has a mirserve.QLinearAdd kernel: the Q/DQ "
                               "form stays for the place passes"]
    _, _, counts = fuse(tmp_path / "x86", binary_model(), kernels=kernels, places="x86/int8/nchw")
    assert counts == {"mirserve.QLinearAdd": 1}


def test_float_ops_outside_quantized_data_are_not_reported(tmp_path):
    model = make_model([make("Add", ["a", "b"], ["c"])], [vinfo("a", shape=[2]), vinfo("b", shape=[2])],
                       [vinfo("c", shape=[2])])
    _, trace, counts = fuse(tmp_path, model)
    assert counts == {"Add": 1} and refusals(trace) == []


# --- the real quantized model --------------------------------------------------------------------------
def _ort_extended_nodes(path, tmp_path) -> int:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return len(onnx.load(str(tmp_path / "ort.onnx")).graph.node)


def test_cls_qdq_default_mode_is_no_larger_than_onnxruntime_extended_and_exact(tmp_path):
    path = CORPUS / "cls_qdq.onnx"
    options = OptimizeOptions(input_shapes=CORPUS_SHAPES["cls_qdq.onnx"], verify_runs=3)
    report = optimize(path, tmp_path / "out.onnx", options)
    verification = report["verification"]
    assert verification["passed"] and verification["runs"] == 3
    assert all(output["max_abs_diff"] == 0 for output in verification["outputs"])
    nodes = len(onnx.load(str(tmp_path / "out.onnx")).graph.node)
    assert nodes <= _ort_extended_nodes(path, tmp_path)
    counts = op_counts(tmp_path / "out.onnx")
    assert counts["mirserve.QLinearConv"] == 53 and "Conv" not in counts
