"""pad_conv_fuse and pad_pool_fuse: a constant Pad on spatial dims becomes the consumer's own pads."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import conv_weight, inferred_model
from tests.engine.passes.fuse.harness import optimize

X = [1, 4, 6, 6]


def pad_then(op: str, pads, *, opset=17, value=None, mode="constant", consumer_attrs=None, axes=None):
    """x -> Pad -> ``op`` -> y, the Pad spelled as ``opset`` wants."""
    inits = []
    attrs = {"mode": mode}
    if opset < 11:
        attrs.update(pads=pads, value=0.0 if value is None else value)
        pad = helper.make_node("Pad", ["x"], ["p"], name="pad", **attrs)
    else:
        names = ["x", "pads"]
        inits.append(tensor("pads", np.array(pads, np.int64)))
        if value is not None or axes is not None:
            names.append("value" if value is not None else "")
            if value is not None:
                inits.append(tensor("value", np.array(value, np.float32)))
        if axes is not None:
            names.append("axes")
            inits.append(tensor("axes", np.array(axes, np.int64)))
        pad = helper.make_node("Pad", names, ["p"], name="pad", **attrs)
    consumer_attrs = dict(consumer_attrs or {})
    if op == "Conv":
        inits.append(tensor("w", conv_weight(c_out=8)))
        node = helper.make_node("Conv", ["p", "w"], ["y"], name="conv", **consumer_attrs)
    else:
        node = helper.make_node(op, ["p"], ["y"], name="pool", kernel_shape=[3, 3], **consumer_attrs)
    return inferred_model([pad, node], [vinfo("x", shape=X)], ["y"], inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 13, 18])
def test_zero_pad_goes_into_the_conv(tmp_path, opset):
    pads = [0, 0, 1, 2, 0, 0, 1, 0]
    out = optimize(tmp_path, pad_then("Conv", pads, opset=opset, consumer_attrs={"pads": [0, 1, 1, 1]}),
                   ["pad_conv_fuse"])
    assert out.ops == ["Conv"]
    assert out.node("Conv").attr("pads") == [1, 3, 2, 1]


def test_pad_with_axes_input(tmp_path):
    out = optimize(tmp_path, pad_then("Conv", [1, 1, 2, 2], opset=18, axes=[2, 3]), ["pad_conv_fuse"])
    assert out.ops == ["Conv"] and out.node("Conv").attr("pads") == [1, 1, 2, 2]


@pytest.mark.parametrize("pads,kwargs,reason", [
    ([0, 0, 1, 1, 0, 0, 1, 1], {"mode": "reflect"}, "pads in 'reflect' mode"),
    ([0, 0, 1, 1, 0, 0, 1, 1], {"value": 1.5}, "fills with 1.5"),
    ([1, 0, 1, 1, 0, 0, 1, 1], {}, "pads the batch or channel dim"),
    ([0, 0, -1, 0, 0, 0, 1, 1], {}, "crops (negative pads)"),
])
def test_conv_refusals(tmp_path, pads, kwargs, reason):
    out = optimize(tmp_path, pad_then("Conv", pads, **kwargs), ["pad_conv_fuse"])
    assert out.ops == ["Pad", "Conv"] and out.refused(reason)


def test_same_auto_pad_is_refused(tmp_path):
    model = pad_then("Conv", [0, 0, 1, 1, 0, 0, 1, 1], consumer_attrs={"auto_pad": "SAME_UPPER"})
    out = optimize(tmp_path, model, ["pad_conv_fuse"])
    assert out.ops == ["Pad", "Conv"] and out.refused("uses SAME auto-padding")


@pytest.mark.parametrize("attrs", [{}, {"count_include_pad": 1, "pads": [1, 0, 1, 0]}])
def test_zero_pad_goes_into_average_pool(tmp_path, attrs):
    out = optimize(tmp_path, pad_then("AveragePool", [0, 0, 1, 1, 0, 0, 1, 1], consumer_attrs=attrs),
                   ["pad_pool_fuse"])
    assert out.ops == ["AveragePool"]
    assert out.node("AveragePool").attr("count_include_pad") == 1


def test_average_pool_leaving_its_own_pads_out_is_refused(tmp_path):
    model = pad_then("AveragePool", [0, 0, 1, 1, 0, 0, 1, 1], consumer_attrs={"pads": [1, 1, 1, 1]})
    out = optimize(tmp_path, model, ["pad_pool_fuse"])
    assert out.ops == ["Pad", "AveragePool"] and out.refused("count_include_pad=0")


def test_minus_infinity_pad_goes_into_max_pool_and_zero_pad_does_not(tmp_path):
    out = optimize(tmp_path, pad_then("MaxPool", [0, 0, 1, 1, 0, 0, 1, 1], value=-np.inf), ["pad_pool_fuse"])
    assert out.ops == ["MaxPool"]
    out = optimize(tmp_path, pad_then("MaxPool", [0, 0, 1, 1, 0, 0, 1, 1]), ["pad_pool_fuse"])
    assert out.ops == ["Pad", "MaxPool"] and out.refused("pads with -inf")


def test_ceil_mode_pool_is_refused(tmp_path):
    model = pad_then("AveragePool", [0, 0, 1, 1, 0, 0, 1, 1], consumer_attrs={"ceil_mode": 1, "strides": [2, 2]})
    out = optimize(tmp_path, model, ["pad_pool_fuse"])
    assert out.ops == ["Pad", "AveragePool"] and out.refused("uses ceil_mode")
