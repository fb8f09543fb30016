"""The activation fusions: which forms fuse, what they carry, and each reason a candidate is refused."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.mirserve_fuse.helpers import (Kernels, assert_same_results, assert_typed_by_onnx, op_counts, refusals,
                                         run_passes, run_reference)

make = helper.make_node
RNG = np.random.default_rng(3)
CONV_PASS = ["conv_activation_fuse"]


def f32(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def scalar(name, value, dtype=np.float32):
    return tensor(name, np.array(value, dtype=dtype))


def conv_model(act_nodes, act_inits=(), *, outputs=("z",), opset=17, conv=None, extra_outputs=()):
    """x [1, 3, 6, 6] -> Conv -> y -> (act_nodes) -> z."""
    conv = conv or make("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    shapes = {"z": [1, 4, 6, 6], "y": [1, 4, 6, 6]}
    outs = [vinfo(name, shape=shapes.get(name, [1, 4, 6, 6])) for name in (*outputs, *extra_outputs)]
    return make_model([conv, *act_nodes], [vinfo("x", shape=[1, 3, 6, 6])], outs,
                      [tensor("w", f32(4, 3, 3, 3)), tensor("b", f32(4)), *act_inits], opset=opset)


def feeds(shape=(1, 3, 6, 6)):
    return {"x": f32(*shape, scale=3.0)}


def fused(tmp_path, model, passes=CONV_PASS, **kwargs):
    output, trace = run_passes(model, tmp_path, passes, **kwargs)
    return output, trace, op_counts(output)


# --- what fuses ----------------------------------------------------------------------------------------
def test_clip_from_zero_without_max_is_relu(tmp_path):
    model = conv_model([make("Clip", ["y", "lo"], ["z"])], [scalar("lo", 0.0)])
    output, _, counts = fused(tmp_path, model)
    assert counts == {"mirserve.FusedConvRelu": 1}
    assert_same_results(tmp_path / "in.onnx", output, feeds())


def test_hard_sigmoid_parameters_are_carried_as_function_attributes(tmp_path):
    model = conv_model([make("HardSigmoid", ["y"], ["z"], alpha=0.3, beta=0.4)])
    output, _, counts = fused(tmp_path, model)
    node = onnx.load(str(output)).graph.node[0]
    assert node.op_type == "FusedConvHardSigmoid" and node.domain == "mirserve"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["activation_alpha"] == pytest.approx(0.3) and attrs["activation_beta"] == pytest.approx(0.4)
    assert attrs["pads"] == [1, 1, 1, 1] and attrs["strides"] == [1, 1] and attrs["group"] == 1
    assert_same_results(tmp_path / "in.onnx", output, feeds())


def test_hard_sigmoid_of_one_sixth_times_input_is_hard_swish(tmp_path):
    model = conv_model([make("HardSigmoid", ["y"], ["h"], alpha=1 / 6, beta=0.5), make("Mul", ["h", "y"], ["z"])],
                       opset=13)
    output, _, counts = fused(tmp_path, model)
    assert counts == {"mirserve.FusedConvHardSwish": 1}
    assert_same_results(tmp_path / "in.onnx", output, feeds())


@pytest.mark.parametrize("scaled", [["y", "k"], ["k", "y"]])
def test_input_times_sigmoid_of_a_scaled_input_is_swish_with_its_factor(tmp_path, scaled):
    # CLIP's quick_gelu: y * sigmoid(1.702 * y), the factor on either side
    nodes = [make("Mul", scaled, ["a"]), make("Sigmoid", ["a"], ["s"]), make("Mul", ["s", "y"], ["z"])]
    output, _, counts = fused(tmp_path, conv_model(nodes, [scalar("k", 1.702)]))
    assert counts == {"mirserve.FusedConvSwish": 1}
    attrs = {a.name: helper.get_attribute_value(a) for a in onnx.load(str(output)).graph.node[0].attribute}
    assert attrs["activation_alpha"] == pytest.approx(1.702)
    assert_same_results(tmp_path / "in.onnx", output, feeds())


def test_swish_whose_factor_is_not_one_number_is_refused(tmp_path):
    nodes = [make("Mul", ["y", "k"], ["a"]), make("Sigmoid", ["a"], ["s"]), make("Mul", ["s", "y"], ["z"])]
    per_channel = tensor("k", np.array([1.0, 1.5, 1.7, 2.0], np.float32).reshape(1, 4, 1, 1))
    assert_refused(tmp_path, conv_model(nodes, [per_channel]), "the factor inside the Sigmoid is not one constant")


@pytest.mark.parametrize("form", ["scale_first", "times_sixth"])
def test_other_orders_of_the_decomposed_hard_swish(tmp_path, form):
    nodes = [make("Add", ["three", "y"], ["a"]), make("Clip", ["a", "lo", "hi"], ["c"])]
    if form == "scale_first":  # y * (Clip(y + 3, 0, 6) / 6)
        nodes += [make("Div", ["c", "six"], ["d"]), make("Mul", ["d", "y"], ["z"])]
    else:  # (y * Clip(y + 3, 0, 6)) * (1 / 6)
        nodes += [make("Mul", ["y", "c"], ["m"]), make("Mul", ["m", "sixth"], ["z"])]
    inits = [scalar("three", 3.0), scalar("lo", 0.0), scalar("hi", 6.0), scalar("six", 6.0),
             scalar("sixth", 1 / 6)]
    output, _, counts = fused(tmp_path, conv_model(nodes, inits))
    assert counts == {"mirserve.FusedConvHardSwish": 1}
    assert_same_results(tmp_path / "in.onnx", output, feeds())


@pytest.mark.parametrize("form", ["y_times_u_then_half", "half_y_times_u", "multiply_by_inverse_sqrt2"])
def test_other_orders_of_the_decomposed_gelu(tmp_path, form):
    shrink = make("Mul", ["y", "inv_sqrt2"], ["d"]) if form == "multiply_by_inverse_sqrt2" \
        else make("Div", ["y", "sqrt2"], ["d"])
    nodes = [shrink, make("Erf", ["d"], ["e"]), make("Add", ["one", "e"], ["u"])]
    if form == "half_y_times_u":
        nodes += [make("Mul", ["y", "half"], ["h"]), make("Mul", ["h", "u"], ["z"])]
    else:
        nodes += [make("Mul", ["u", "y"], ["m"]), make("Mul", ["m", "half"], ["z"])]
    inits = [scalar("sqrt2", math.sqrt(2)), scalar("inv_sqrt2", 1 / math.sqrt(2)), scalar("one", 1.0),
             scalar("half", 0.5)]
    output, _, counts = fused(tmp_path, conv_model(nodes, inits))
    assert counts == {"mirserve.FusedConvGelu": 1}
    assert_same_results(tmp_path / "in.onnx", output, feeds())


def test_constants_only_the_activation_read_are_removed_and_shared_ones_kept(tmp_path):
    nodes = [make("Add", ["y", "three"], ["a"]), make("Clip", ["a", "lo", "hi"], ["c"]),
             make("Mul", ["y", "c"], ["m"]), make("Div", ["m", "six"], ["z"]), make("Mul", ["z", "six"], ["k"])]
    inits = [scalar("three", 3.0), scalar("lo", 0.0), scalar("hi", 6.0), scalar("six", 6.0)]
    output, _, counts = fused(tmp_path, conv_model(nodes, inits, outputs=("k",)))
    assert counts == {"mirserve.FusedConvHardSwish": 1, "Mul": 1}
    names = {t.name for t in onnx.load(str(output)).graph.initializer}
    assert "six" in names and not names & {"three", "lo", "hi"}


def test_conv_without_bias_gets_a_zero_bias(tmp_path):
    model = conv_model([make("Relu", ["y"], ["z"])], conv=make("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]))
    output, _, counts = fused(tmp_path, model)
    saved = onnx.load(str(output))
    assert len(saved.graph.node[0].input) == 3
    bias = {t.name: t for t in saved.graph.initializer}[saved.graph.node[0].input[2]]
    assert onnx.numpy_helper.to_array(bias).tolist() == [0.0] * 4
    assert_same_results(tmp_path / "in.onnx", output, feeds())


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_becomes_explicit_pads(tmp_path, auto_pad):
    conv = make("Conv", ["x", "w", "b"], ["y"], auto_pad=auto_pad, strides=[2, 2], kernel_shape=[4, 4])
    size = 2 if auto_pad == "VALID" else 4
    model = make_model([conv, make("Relu", ["y"], ["z"])], [vinfo("x", shape=[1, 3, 7, 7])],
                       [vinfo("z", shape=[1, 4, size, size])], [tensor("w", f32(4, 3, 4, 4)), tensor("b", f32(4))])
    output, _, counts = fused(tmp_path, model)
    assert counts == {"mirserve.FusedConvRelu": 1}
    assert_same_results(tmp_path / "in.onnx", output, feeds((1, 3, 7, 7)))


def test_a_graph_output_produced_by_the_activation_keeps_its_name(tmp_path):
    output, _, counts = fused(tmp_path, conv_model([make("Relu", ["y"], ["z"])]))
    assert counts == {"mirserve.FusedConvRelu": 1}
    saved = onnx.load(str(output))
    assert [o.name for o in saved.graph.output] == ["z"] and saved.graph.node[0].output == ["z"]


def test_sum_of_two_fuses_and_sum_of_three_does_not(tmp_path):
    nodes = [make("Sum", ["x", "x2"], ["s2"]), make("Relu", ["s2"], ["r2"]),
             make("Sum", ["x", "x2", "x2"], ["s3"]), make("Relu", ["s3"], ["r3"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 4]), vinfo("x2", shape=[4])],
                       [vinfo("r2", shape=[2, 4]), vinfo("r3", shape=[2, 4])], opset=9)
    output, _, counts = fused(tmp_path, model, ["elementwise_activation_fuse"])
    assert counts == {"mirserve.FusedAddRelu": 1, "Sum": 1, "Relu": 1}
    assert_same_results(tmp_path / "in.onnx", output, {"x": f32(2, 4, scale=3), "x2": f32(4, scale=3)})


def test_fusions_run_inside_if_branches(tmp_path):
    branch = helper.make_graph([make("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]), make("Relu", ["y"], ["t"])],
                               "then", [], [vinfo("t", shape=[1, 4, 6, 6])])
    other = helper.make_graph([make("Identity", ["x4"], ["e"])], "else", [], [vinfo("e", shape=[1, 4, 6, 6])])
    model = make_model([make("If", ["cond"], ["z"], then_branch=branch, else_branch=other)],
                       [vinfo("x", shape=[1, 3, 6, 6]), vinfo("x4", shape=[1, 4, 6, 6]),
                        vinfo("cond", TensorProto.BOOL, [])], [vinfo("z", shape=[1, 4, 6, 6])],
                       [tensor("w", f32(4, 3, 3, 3)), tensor("b", f32(4))])
    output, trace, _ = fused(tmp_path, model)
    assert trace[-1]["rewrites"] == 1
    body = {a.name: a.g for a in onnx.load(str(output)).graph.node[0].attribute}["then_branch"]
    assert [n.op_type for n in body.node] == ["FusedConvRelu"]
    assert_same_results(tmp_path / "in.onnx", output,
                        {"x": f32(1, 3, 6, 6), "x4": f32(1, 4, 6, 6), "cond": np.array(True)})


def float16_model(opset, activation="Clip"):
    act = make("Clip", ["s", "lo", "hi"], ["z"]) if activation == "Clip" else make("LeakyRelu", ["s"], ["z"], alpha=0.5)
    inits = [scalar("lo", 0, np.float16), scalar("hi", 6, np.float16)] if activation == "Clip" else []
    return make_model([make("Add", ["x", "x"], ["s"]), act], [vinfo("x", TensorProto.FLOAT16, [4])],
                      [vinfo("z", TensorProto.FLOAT16, [4])], inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 17])  # numbers take the data's type: Gemm/EyeLike, then CastLike
def test_float16_data_fuses_with_numbers_of_its_type(tmp_path, opset):
    output, _, counts = fused(tmp_path, float16_model(opset), ["elementwise_activation_fuse"])
    assert counts == {"mirserve.FusedAddRelu6": 1}
    x = np.array([-2, 1, 5, 9], dtype=np.float16)
    result = run_reference(output, {"x": x})[0]
    assert result.dtype == np.float16 and result.tolist() == [0, 2, 6, 6]
    onnx.checker.check_model(onnx.load(str(output)), full_check=True)
    assert_same_results(tmp_path / "in.onnx", output, {"x": x})


def test_fused_outputs_in_a_chain_are_typed_by_onnx(tmp_path):
    nodes = [make("Relu", ["y"], ["r"]), make("Conv", ["r", "w2"], ["y2"], pads=[1, 1, 1, 1]),
             make("LeakyRelu", ["y2"], ["z"], alpha=0.2)]
    model = conv_model(nodes, [tensor("w2", f32(4, 4, 3, 3))], opset=11)
    output, _, counts = fused(tmp_path, model)
    assert counts == {"mirserve.FusedConvRelu": 1, "mirserve.FusedConvLeakyRelu": 1}
    assert_typed_by_onnx(output)
    assert_same_results(tmp_path / "in.onnx", output, feeds())


# --- what is refused, and why ------------------------------------------------------------------------------
def assert_refused(tmp_path, model, reason, passes=CONV_PASS, **kwargs):
    source = op_counts_of(model)
    output, trace, counts = fused(tmp_path, model, passes, **kwargs)
    assert counts == source, "the model must be left as it was"
    assert any(reason in r for r in refusals(trace)), refusals(trace)


def op_counts_of(model):
    return Counter(n.op_type for n in model.graph.node)


def test_float16_below_opset_9_is_refused_where_the_body_needs_numbers(tmp_path):
    assert_refused(tmp_path, float16_model(8, "LeakyRelu"), "FusedAddLeakyRelu: its body holds float32 "
                   "constants, which only EyeLike (opset 9) or CastLike (opset 15) can give another type, and "
                   "the data is float16 at opset 8", ["elementwise_activation_fuse"])


def test_clip_to_other_bounds_is_not_relu6(tmp_path):
    model = conv_model([make("Clip", ["y", "lo", "hi"], ["z"])], [scalar("lo", 0.0), scalar("hi", 5.0)])
    assert_refused(tmp_path, model, "FusedConvRelu6: Clip(0, 5) is not Relu6, which is Clip(0, 6)")


def test_clip_with_bounds_known_only_at_run_time_is_refused(tmp_path):
    model = make_model([make("Conv", ["x", "w"], ["y"]), make("Clip", ["y", "lo", "hi"], ["z"])],
                       [vinfo("x", shape=[1, 3, 6, 6]), vinfo("lo", shape=[]), vinfo("hi", shape=[])],
                       [vinfo("z", shape=[1, 4, 4, 4])], [tensor("w", f32(4, 3, 3, 3))])
    assert_refused(tmp_path, model, "the Clip bounds are not constant scalars")


def test_hard_sigmoid_times_input_with_other_parameters_is_not_hard_swish(tmp_path):
    model = conv_model([make("HardSigmoid", ["y"], ["h"], alpha=0.2, beta=0.5), make("Mul", ["y", "h"], ["z"])])
    assert_refused(tmp_path, model, "HardSigmoid(alpha=0.2, beta=0.5) times its input is not HardSwish")


def test_decomposed_hard_swish_with_other_constants_is_refused(tmp_path):
    nodes = [make("Add", ["y", "two"], ["a"]), make("Clip", ["a", "lo", "hi"], ["c"]),
             make("Mul", ["y", "c"], ["m"]), make("Div", ["m", "six"], ["z"])]
    inits = [scalar("two", 2.0), scalar("lo", 0.0), scalar("hi", 6.0), scalar("six", 6.0)]
    assert_refused(tmp_path, conv_model(nodes, inits), "y * Clip(y + 2, 0, 6) / 6 is not HardSwish")


def test_output_read_by_another_node_is_refused(tmp_path):
    model = conv_model([make("Relu", ["y"], ["r"]), make("Add", ["r", "y"], ["z"])])
    assert_refused(tmp_path, model, "FusedConvRelu: the intermediate 'y' is also read by Add")


def test_output_that_is_a_graph_output_is_refused(tmp_path):
    model = conv_model([make("Relu", ["y"], ["z"])], extra_outputs=("y",))
    assert_refused(tmp_path, model, "FusedConvRelu: the intermediate 'y' is also a graph output")


def test_intermediate_read_elsewhere_is_refused(tmp_path):
    model = conv_model([make("Sigmoid", ["y"], ["s"]), make("Mul", ["y", "s"], ["m"]), make("Add", ["m", "s"], ["z"])])
    assert_refused(tmp_path, model, "FusedConvSilu: the intermediate 's' is also read by Add")


def test_an_activation_inside_a_nested_body_is_not_a_match(tmp_path):
    """A rewrite never spans a body and the graph around it: the fused op would have to be in two graphs."""
    branch = helper.make_graph([make("Relu", ["y"], ["t"])], "then", [], [vinfo("t", shape=[1, 4, 6, 6])])
    other = helper.make_graph([make("Identity", ["x4"], ["e"])], "else", [], [vinfo("e", shape=[1, 4, 6, 6])])
    model = make_model([make("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
                        make("If", ["cond"], ["z"], then_branch=branch, else_branch=other)],
                       [vinfo("x", shape=[1, 3, 6, 6]), vinfo("x4", shape=[1, 4, 6, 6]),
                        vinfo("cond", TensorProto.BOOL, [])],
                       [vinfo("z", shape=[1, 4, 6, 6])], [tensor("w", f32(4, 3, 3, 3)), tensor("b", f32(4))])
    output, trace = run_passes(model, tmp_path, CONV_PASS)
    assert op_counts(output) == {"Conv": 1, "If": 1} and refusals(trace) == []


def test_tanh_approximation_of_gelu_is_refused(tmp_path):
    model = conv_model([make("Gelu", ["y"], ["z"], approximate="tanh")], opset=20)
    assert_refused(tmp_path, model, "Gelu with approximate='tanh' is not the exact Gelu")


def test_conv_transpose_with_output_shape_is_refused(tmp_path):
    conv = make("ConvTranspose", ["x", "wt", "bt"], ["y"], strides=[2, 2], output_shape=[12, 12])
    model = make_model([conv, make("Relu", ["y"], ["z"])], [vinfo("x", shape=[1, 3, 6, 6])],
                       [vinfo("z", shape=[1, 4, 12, 12])], [tensor("wt", f32(3, 4, 3, 3)), tensor("bt", f32(4))])
    assert_refused(tmp_path, model, "it sets output_shape or auto_pad SAME")


def test_no_kernel_in_any_valid_place_is_refused_and_a_kernel_in_one_is_enough(tmp_path):
    model = conv_model([make("Relu", ["y"], ["z"])])
    assert_refused(tmp_path, model, "no valid place (arm, host) has a mirserve.FusedConvRelu kernel",
                   places="arm/fp32/nchw", kernels=Kernels(("FusedConvRelu", "mirserve", "x86")))
    (tmp_path / "two").mkdir()
    _, _, counts = fused(tmp_path / "two", model, places="arm/fp32/nchw",
                         kernels=Kernels(("FusedConvRelu", "mirserve", "arm")))
    assert counts == {"mirserve.FusedConvRelu": 1}


def test_portable_runs_skip_every_domain_fusion(tmp_path):
    from worker.engine.passes.pipelines import DOMAIN_FUSE

    output, trace, counts = fused(tmp_path, conv_model([make("Relu", ["y"], ["z"])]), list(DOMAIN_FUSE),
                                  portable=True)
    assert counts == {"Conv": 1, "Relu": 1}
    assert all("portable" in entry["skipped"] for entry in trace[1:])
