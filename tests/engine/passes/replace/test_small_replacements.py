"""prelu_leaky_relu_replace, adaptive_pool_global_replace, transpose_softmax_transpose_fuse."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import optimize

X = [1, 3, 5, 4]


@pytest.mark.parametrize("slope", [np.float32(0.1), np.full((3, 1, 1), 0.25, np.float32), np.full([1], -0.5,
                                                                                                  np.float32)])
def test_prelu_with_one_slope_becomes_leaky_relu(tmp_path, slope):
    nodes = [helper.make_node("PRelu", ["x", "s"], ["y"], name="prelu")]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=X)], ["y"], [tensor("s", slope)], opset=9),
                   ["prelu_leaky_relu_replace"])
    assert out.ops == ["LeakyRelu"] and out.node("LeakyRelu").attr("alpha") == pytest.approx(float(slope.flat[0]))
    assert not out.model.graph.initializers


def test_prelu_stays_where_leaky_relu_would_run_on_a_worse_place(tmp_path):
    # ARM runs PRelu in fp16 but LeakyRelu in fp32 only: the replacement would lose the fp16 place (issue 12)
    nodes = [helper.make_node("PRelu", ["x", "s"], ["y"], name="prelu")]
    model = inferred_model(nodes, [vinfo("x", shape=X)], ["y"], [tensor("s", np.float32(0.1))], opset=9)
    out = optimize(tmp_path, model, ["prelu_leaky_relu_replace"], places="arm/fp16/nhwc,arm/fp32/nchw")
    assert out.ops == ["PRelu"]
    assert out.refused("LeakyRelu would run on arm/fp32/nchw at best, while PRelu prelu runs on arm/fp16/")
    out = optimize(tmp_path, model, ["prelu_leaky_relu_replace"], places="arm/fp32/nchw")
    assert out.ops == ["LeakyRelu"]


def test_prelu_with_per_channel_slopes_is_refused(tmp_path):
    nodes = [helper.make_node("PRelu", ["x", "s"], ["y"], name="prelu")]
    slope = np.array([0.1, 0.2, 0.1], np.float32).reshape(3, 1, 1)
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=X)], ["y"], [tensor("s", slope)]),
                   ["prelu_leaky_relu_replace"])
    assert out.ops == ["PRelu"] and out.refused("PRelu 'prelu' has 2 different slopes")


def test_prelu_with_a_variable_slope_is_refused(tmp_path):
    nodes = [helper.make_node("PRelu", ["x", "s"], ["y"], name="prelu")]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=X), vinfo("s", shape=[1])], ["y"]),
                   ["prelu_leaky_relu_replace"])
    assert out.ops == ["PRelu"] and out.refused("is not a constant")


@pytest.mark.parametrize("op,pool", [("AveragePool", "GlobalAveragePool"), ("MaxPool", "GlobalMaxPool")])
def test_pool_covering_its_input_becomes_global(tmp_path, op, pool):
    nodes = [helper.make_node(op, ["x"], ["y"], kernel_shape=[5, 4], strides=[5, 4], name="pool")]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=X)], ["y"]), ["adaptive_pool_global_replace"])
    assert out.ops == [pool]


def test_pool_that_pads_or_does_not_cover_is_left(tmp_path):
    nodes = [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[5, 4], pads=[1, 0, 1, 0], name="pool")]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=X)], ["y"]), ["adaptive_pool_global_replace"])
    assert out.ops == ["AveragePool"] and out.refused("pads its input")
    nodes = [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[5, 3], name="pool")]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=X)], ["y"]), ["adaptive_pool_global_replace"])
    assert out.ops == ["AveragePool"] and out.rewrites("adaptive_pool_global_replace") == 0


def softmax_between(perm, axis, opset, op="Softmax"):
    inv = list(np.argsort(perm))
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm, name="t1"),
             helper.make_node(op, ["t"], ["s"], axis=axis, name="softmax"),
             helper.make_node("Transpose", ["s"], ["y"], perm=[int(i) for i in inv], name="t2")]
    return inferred_model(nodes, [vinfo("x", shape=[2, 3, 4, 5])], ["y"], opset=opset)


@pytest.mark.parametrize("perm,axis,expected", [([0, 3, 1, 2], 3, 2), ([0, 2, 3, 1], -1, 1), ([1, 0, 2, 3], 1, 0)])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_between_transposes_at_opset_13(tmp_path, perm, axis, expected, op):
    out = optimize(tmp_path, softmax_between(perm, axis, 13, op), ["transpose_softmax_transpose_fuse"])
    assert out.ops == [op] and out.node(op).attr("axis") == expected


def test_softmax_before_opset_13(tmp_path):
    out = optimize(tmp_path, softmax_between([1, 0, 2, 3], 2, 11), ["transpose_softmax_transpose_fuse"])
    assert out.ops == ["Softmax"] and out.node("Softmax").attr("axis") == 2
    out = optimize(tmp_path, softmax_between([0, 2, 3, 1], 3, 11), ["transpose_softmax_transpose_fuse"])
    assert out.ops == ["Transpose", "Softmax", "Transpose"]
    assert out.refused("before opset 13 Softmax 'softmax' normalizes dims 3.. together")


def test_transposes_that_do_not_cancel_are_refused(tmp_path):
    model = softmax_between([0, 3, 1, 2], 3, 13)
    model.graph.node[2].attribute[0].ints[:] = [0, 3, 1, 2]
    model = inferred_model(list(model.graph.node), [vinfo("x", shape=[2, 3, 4, 5])], ["y"], opset=13)
    out = optimize(tmp_path, model, ["transpose_softmax_transpose_fuse"])
    assert len(out.ops) == 3 and out.refused("does not undo")
