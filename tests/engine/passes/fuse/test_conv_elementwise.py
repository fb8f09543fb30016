"""conv_elementwise_fuse: a per-channel Add/Sub after a conv becomes its bias; other broadcasts are refused."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.passes.fuse.builders import C_OUT, SIDE, conv_then, per_channel
from tests.engine.passes.fuse.harness import optimize

PASS = "conv_elementwise_fuse"


@pytest.mark.parametrize("shape", [[1, C_OUT, 1, 1], [C_OUT, 1, 1], [1], []])
@pytest.mark.parametrize("after", ["Add", "Sub"])
def test_per_channel_add_becomes_the_bias(tmp_path, shape, after):
    out = optimize(tmp_path, conv_then(after, per_channel(*shape)), [PASS])
    assert out.ops == ["Conv"] and out.rewrites(PASS) == 1
    assert out.node("Conv").output().name == "y"
    assert len(out.model.graph.initializers) == 2  # the old bias and the constant are gone


def test_constant_first_without_bias_from_a_constant_node(tmp_path):
    model = conv_then("Add", per_channel(1, C_OUT, 1, 1), bias=False, constant_first=True, constant_node=True)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Conv"]  # the Constant node is removed with its last use
    assert out.node("Conv").input(2) is not None


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose(tmp_path, group):
    out = optimize(tmp_path, conv_then("Add", per_channel(C_OUT, 1, 1), op="ConvTranspose", group=group), [PASS])
    assert out.ops == ["ConvTranspose"]


@pytest.mark.parametrize("shape,what", [([1, C_OUT, SIDE, SIDE], "full tensor"), ([1, 1, SIDE, 1], "over H"),
                                        ([2, C_OUT, 1, 1], "enlarging N")])
def test_add_that_is_not_per_channel_is_refused(tmp_path, shape, what):
    out_shape = list(np.broadcast_shapes(tuple(shape), (1, C_OUT, SIDE, SIDE)))
    model = conv_then("Add", per_channel(*shape), out_shape=out_shape)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Conv", "Add"], what
    assert out.refused(f"has shape {shape}, not one value per output channel ({C_OUT})")


def test_conv_output_that_is_a_graph_output_is_not_fused(tmp_path):
    out = optimize(tmp_path, conv_then("Add", per_channel(C_OUT, 1, 1), outputs=("y", "c")), [PASS])
    assert out.ops == ["Conv", "Add"] and out.rewrites(PASS) == 0


def test_weights_that_are_not_constants_are_refused(tmp_path):
    out = optimize(tmp_path, conv_then("Add", per_channel(C_OUT, 1, 1), weight_input=True), [PASS])
    assert out.ops == ["Conv", "Add"]
    assert out.refused("the weights of Conv 'conv' ('w') are not constants")
