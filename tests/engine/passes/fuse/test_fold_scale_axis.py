"""fold_scale_axis: per-channel Mul/Add before Conv/Gemm/MatMul and Mul after Gemm/MatMul into the weights."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import conv_weight, inferred_model, per_channel
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "fold_scale_axis"


def before_conv(op, constant, *, conv="Conv", group=1, pads=(0, 0, 0, 0), bias=True, x_shape=(1, 4, 6, 6)):
    nodes = [helper.make_node(op, ["x", "k"], ["t"], name="elementwise"),
             helper.make_node(conv, ["t", "w"] + (["b"] if bias else []), ["y"], name="conv", group=group,
                              pads=list(pads))]
    inits = [tensor("k", constant), tensor("w", conv_weight(conv, group))]
    if bias:
        inits.append(tensor("b", floats(8, seed=4)))
    return inferred_model(nodes, [vinfo("x", shape=list(x_shape))], ["y"], inits)


@pytest.mark.parametrize("conv,group", [("Conv", 1), ("Conv", 2), ("Conv", 4), ("ConvTranspose", 2)])
@pytest.mark.parametrize("op", ["Mul", "Div"])
def test_scale_before_a_conv_goes_into_its_weights(tmp_path, conv, group, op):
    out = optimize(tmp_path, before_conv(op, per_channel(4, 1, 1), conv=conv, group=group, pads=(1, 1, 1, 1)),
                   [PASS])
    assert out.ops == [conv] and out.rewrites(PASS) == 1


@pytest.mark.parametrize("group,bias", [(1, True), (2, False)])
@pytest.mark.parametrize("op", ["Add", "Sub"])
def test_shift_before_an_unpadded_conv_goes_into_its_bias(tmp_path, op, group, bias):
    out = optimize(tmp_path, before_conv(op, per_channel(1, 4, 1, 1, low=-1), group=group, bias=bias), [PASS])
    assert out.ops == ["Conv"]


def test_shift_before_a_padded_conv_is_refused(tmp_path):
    out = optimize(tmp_path, before_conv("Add", per_channel(4, 1, 1), pads=(1, 1, 1, 1)), [PASS])
    assert out.ops == ["Add", "Conv"] and out.refused("pads its input")


def test_scale_over_h_is_refused(tmp_path):
    out = optimize(tmp_path, before_conv("Mul", per_channel(6, 1)), [PASS])
    assert out.ops == ["Mul", "Conv"] and out.refused("has shape [6, 1], not one value per channel")


def test_scale_that_broadcasts_the_input_is_refused(tmp_path):
    out = optimize(tmp_path, before_conv("Mul", per_channel(1, 4, 1, 1), x_shape=(1, 1, 6, 6)), [PASS])
    assert out.ops == ["Mul", "Conv"] and out.refused("by broadcasting")


def gemm_model(*, before=None, after=None, trans_a=0, trans_b=0, with_c=True, op="Gemm", x_shape=(3, 4)):
    k, n = 4, 5
    nodes, inits, data = [], [], "x"
    if before:
        nodes.append(helper.make_node(before[0], ["x", "kb"], ["t"], name="before"))
        inits.append(tensor("kb", before[1]))
        data = "t"
    gemm_out = "g" if after else "y"
    inputs = [data, "w"] + (["c"] if with_c and op == "Gemm" else [])
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 2.0} if op == "Gemm" else {}
    nodes.append(helper.make_node(op, inputs, [gemm_out], name="linear", **attrs))
    inits.append(tensor("w", floats(n, k) if trans_b else floats(k, n)))
    if with_c and op == "Gemm":
        inits.append(tensor("c", floats(n, seed=5)))
    if after:
        nodes.append(helper.make_node(after[0], ["g", "ka"], ["y"], name="after"))
        inits.append(tensor("ka", after[1]))
    shape = list(x_shape) if not trans_a else list(reversed(x_shape))
    return inferred_model(nodes, [vinfo("x", shape=shape)], ["y"], inits)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1)])
def test_scale_and_shift_before_a_gemm(tmp_path, trans_a, trans_b):
    shape = [4, 1] if trans_a else [4]
    for op in ("Mul", "Add"):
        model = gemm_model(before=(op, per_channel(*shape, low=-2)), trans_a=trans_a, trans_b=trans_b)
        out = optimize(tmp_path, model, [PASS])
        assert out.ops == ["Gemm"], op


@pytest.mark.parametrize("trans_b,with_c", [(0, True), (1, False)])
def test_scale_after_a_gemm(tmp_path, trans_b, with_c):
    out = optimize(tmp_path, gemm_model(after=("Div", per_channel(1, 5)), trans_b=trans_b, with_c=with_c), [PASS])
    assert out.ops == ["Gemm"]


def test_scale_before_and_after_a_matmul(tmp_path):
    model = gemm_model(before=("Mul", per_channel(4)), after=("Mul", per_channel(5, seed=9)), op="MatMul",
                       x_shape=(2, 3, 4))
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["MatMul"] and out.rewrites(PASS) == 2


def test_matmul_of_two_activations_is_refused(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "z"], ["g"], name="mm"),
             helper.make_node("Mul", ["g", "k"], ["y"])]
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4]), vinfo("z", shape=[4, 5])], ["y"],
                           [tensor("k", np.float32(0.5))])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["MatMul", "Mul"] and out.refused("the weights of MatMul 'mm' ('z') are not constants")


@pytest.mark.parametrize("conv", ["Conv", "ConvTranspose"])
def test_scale_then_shift_before_a_padded_conv_keeps_one_add(tmp_path, conv):
    nodes = [helper.make_node("Mul", ["k", "x"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node(conv, ["u", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    inits = [tensor("k", per_channel(1, 4, 1, 1, low=-2)), tensor("b", per_channel(4, 1, 1, seed=5)),
             tensor("w", conv_weight(conv))]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=[1, 4, 6, 6])], ["y"], inits), [PASS])
    assert out.ops == ["Add", conv]
    assert out.node("Add").output().shape == (1, 4, 6, 6)
