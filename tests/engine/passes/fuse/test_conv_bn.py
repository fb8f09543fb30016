"""conv_bn_fuse: Conv/ConvTranspose + BatchNormalization -> one conv; refusals for statistics and weights."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "conv_bn_fuse"


def bn_tensors(channels: int, prefix: str = "bn") -> list:
    r = np.random.default_rng(7)
    return [tensor(f"{prefix}_scale", r.uniform(0.5, 2, channels).astype(np.float32)),
            tensor(f"{prefix}_bias", r.uniform(-1, 1, channels).astype(np.float32)),
            tensor(f"{prefix}_mean", r.uniform(-1, 1, channels).astype(np.float32)),
            tensor(f"{prefix}_var", r.uniform(0.001, 0.01, channels).astype(np.float32))]


def bn_node(x: str, out: str, epsilon: float = 0.05, prefix: str = "bn", **kwargs):
    names = [x] + [f"{prefix}_{k}" for k in ("scale", "bias", "mean", "var")]
    return helper.make_node("BatchNormalization", names, [out], epsilon=epsilon, name=prefix, **kwargs)


def conv_bn_model(*, bias=True, group=1, op="Conv", outputs=("y",), extra_nodes=(), weight_from=None,
                  opset=17, inputs=(), first_nodes=(), extra_inits=()):
    c_in, c_out = 4, 8
    if op == "Conv":
        weight = floats(c_out, c_in // group, 3, 3, seed=1)
    else:
        weight = floats(c_in, c_out // group, 3, 3, seed=1)
    inits = bn_tensors(c_out) + list(extra_inits)
    conv_inputs = ["x", weight_from or "w"] + (["b"] if bias else [])
    if weight_from is None:
        inits.append(tensor("w", weight))
    if bias:
        inits.append(tensor("b", floats(c_out, seed=2)))
    nodes = [*first_nodes, helper.make_node(op, conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1], group=group),
             bn_node("c", "y"), *extra_nodes]
    out_shape = [1, c_out, 6, 6]
    outs = [vinfo(name, shape=out_shape) for name in outputs]
    return make_model(nodes, [vinfo("x", shape=[1, c_in, 6, 6]), *inputs], outs, inits, opset=opset)


@pytest.mark.parametrize("op,group,bias", [("Conv", 1, True), ("Conv", 2, False), ("Conv", 4, True),
                                           ("ConvTranspose", 1, True), ("ConvTranspose", 2, False)])
def test_conv_and_batchnorm_become_one_conv(tmp_path, op, group, bias):
    out = optimize(tmp_path, conv_bn_model(op=op, group=group, bias=bias), [PASS])
    assert out.ops == [op]
    assert out.rewrites(PASS) == 1
    assert out.entry(PASS)["details"][0]["from"] == ["conv", "bn"]
    conv = out.node(op)
    assert conv.output().name == "y" and conv.attr("group", 1) == group
    assert set(out.model.graph.initializers) == {conv.input(1).name, conv.input(2).name}


def test_epsilon_is_part_of_the_fold(tmp_path):
    # var is 0.001..0.01 and epsilon 0.05: ignoring epsilon would be far outside the tolerance
    out = optimize(tmp_path, conv_bn_model(), [PASS])
    assert out.ops == ["Conv"]


def test_statistics_that_are_not_constants_are_refused(tmp_path):
    model = conv_bn_model(inputs=[vinfo("m", shape=[8])])
    model.graph.node[1].input[3] = "m"
    del model.graph.initializer[2]
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Conv", "BatchNormalization"]
    assert out.refused("statistics of BatchNormalization 'bn' (input_mean) are not constants")


def test_quantized_weights_are_refused(tmp_path):
    dq = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dq")]
    quantized = np.random.default_rng(0).integers(-100, 100, (8, 4, 3, 3)).astype(np.int8)
    model = conv_bn_model(weight_from="wd", first_nodes=dq, extra_inits=[
        tensor("wq", quantized), tensor("ws", np.float32(0.01)), tensor("wz", np.int8(0))])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["DequantizeLinear", "Conv", "BatchNormalization"]
    assert out.refused("weights of Conv 'conv' are quantized (they come from DequantizeLinear 'dq')")


def test_weights_that_are_not_constants_are_refused(tmp_path):
    model = conv_bn_model(weight_from="wx", inputs=[vinfo("wx", shape=[8, 4, 3, 3])])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Conv", "BatchNormalization"]
    assert out.refused("the weights of Conv 'conv' ('wx') are not constants")


def test_conv_output_used_elsewhere_is_not_fused(tmp_path):
    out = optimize(tmp_path, conv_bn_model(outputs=("y", "c")), [PASS])
    assert out.ops == ["Conv", "BatchNormalization"] and out.rewrites(PASS) == 0
    extra = [helper.make_node("Relu", ["c"], ["r"])]
    out = optimize(tmp_path, conv_bn_model(outputs=("y", "r"), extra_nodes=extra), [PASS])
    assert out.rewrites(PASS) == 0


def test_training_mode_is_refused(tmp_path):
    model = conv_bn_model()
    model.graph.node[1].attribute.append(helper.make_attribute("training_mode", 1))
    model.graph.node[1].output.extend(["running_mean", "running_var"])
    out = optimize(tmp_path, model, [PASS], check=False)
    assert out.refused("is in training mode") and out.rewrites(PASS) == 0


def test_fusion_inside_an_if_body(tmp_path):
    weight, inits = floats(8, 4, 3, 3, seed=1), bn_tensors(8)
    body_nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]), bn_node("c", "t")]
    then = helper.make_graph(body_nodes, "then", [], [vinfo("t", shape=[1, 8, 6, 6])])
    other = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["e"], pads=[1, 1, 1, 1])], "else", [],
                              [vinfo("e", shape=[1, 8, 6, 6])])
    model = make_model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                       [vinfo("x", shape=[1, 4, 6, 6]), vinfo("cond", TensorProto.BOOL, [])],
                       [vinfo("y", shape=[1, 8, 6, 6])], [tensor("w", weight), *inits])
    out = optimize(tmp_path, model, [PASS], fixed={"cond": np.array(True)})
    body = out.node("If").attr("then_branch")
    assert [n.op_type for n in body] == ["Conv"] and out.rewrites(PASS) == 1
    assert body.outputs[0].name == "t"


def test_two_convs_sharing_weights_each_get_their_own(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], name="conv1"), bn_node("c1", "y1", prefix="bn"),
             helper.make_node("Conv", ["x", "w"], ["c2"], name="conv2"), bn_node("c2", "y2", prefix="bn2")]
    inits = [tensor("w", floats(8, 4, 1, 1, seed=1)), *bn_tensors(8), *bn_tensors(8, prefix="bn2")]
    inits[-1] = tensor("bn2_var", np.full(8, 4.0, np.float32))
    outputs = [vinfo("y1", shape=[1, 8, 6, 6]), vinfo("y2", shape=[1, 8, 6, 6])]
    out = optimize(tmp_path, make_model(nodes, [vinfo("x", shape=[1, 4, 6, 6])], outputs, inits), [PASS])
    assert out.ops == ["Conv", "Conv"]
    first, second = out.model.graph.nodes_of_type("Conv")
    assert first.input(1) is not second.input(1) and "w" not in out.model.graph.initializers


def test_one_d_convolution(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1]), bn_node("c", "y")]
    model = make_model(nodes, [vinfo("x", shape=[2, 4, 9])], [vinfo("y", shape=[2, 8, 9])],
                       [tensor("w", floats(8, 4, 3, seed=1)), *bn_tensors(8)])
    assert optimize(tmp_path, model, [PASS]).ops == ["Conv"]


def test_fusion_inside_a_loop_body(tmp_path):
    body_nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]), bn_node("c", "t"),
                  helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body_inputs = [vinfo("i", TensorProto.INT64, []), vinfo("cond_in", TensorProto.BOOL, [])]
    body = helper.make_graph(body_nodes, "body", body_inputs,
                             [vinfo("cond_out", TensorProto.BOOL, []), vinfo("t", shape=[1, 8, 6, 6])])
    loop = helper.make_node("Loop", ["n", ""], ["ys"], body=body)
    model = make_model([loop], [vinfo("x", shape=[1, 4, 6, 6])], [vinfo("ys", shape=[2, 1, 8, 6, 6])],
                       [tensor("w", floats(8, 4, 3, 3, seed=1)), *bn_tensors(8), tensor("n", np.array(2, np.int64))])
    out = optimize(tmp_path, model, [PASS])
    inner = out.node("Loop").attr("body")
    assert [n.op_type for n in inner] == ["Conv", "Identity"] and out.rewrites(PASS) == 1


def test_weights_that_do_not_fit_the_group_are_refused(tmp_path):
    # ConvTranspose weights are [C_in, C_out/group, ...]: 4 input channels cannot split into 3 groups
    model = conv_bn_model(op="ConvTranspose")
    next(a for a in model.graph.node[0].attribute if a.name == "group").i = 3
    out = optimize(tmp_path, model, [PASS], check=False, valid=False)
    assert out.ops == ["ConvTranspose", "BatchNormalization"]
    assert out.refused("have shape [4, 8, 3, 3], which does not fit group=3")
