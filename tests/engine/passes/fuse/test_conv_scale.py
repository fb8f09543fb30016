"""conv_scale_fuse: a per-channel Mul/Div after a conv goes into its weights; refusals for shape and zeros."""
from __future__ import annotations

import pytest

from tests.engine.passes.fuse.builders import C_OUT, SIDE, conv_then, per_channel
from tests.engine.passes.fuse.harness import optimize

PASS = "conv_scale_fuse"


@pytest.mark.parametrize("shape", [[1, C_OUT, 1, 1], [C_OUT, 1, 1], [1]])
@pytest.mark.parametrize("after", ["Mul", "Div"])
def test_per_channel_scale_goes_into_the_weights(tmp_path, shape, after):
    out = optimize(tmp_path, conv_then(after, per_channel(*shape), constant_first=after == "Mul"), [PASS])
    assert out.ops == ["Conv"] and out.rewrites(PASS) == 1


@pytest.mark.parametrize("op,group,bias", [("ConvTranspose", 1, True), ("ConvTranspose", 2, False),
                                           ("Conv", 2, False)])
def test_grouped_and_transposed(tmp_path, op, group, bias):
    model = conv_then("Mul", per_channel(1, C_OUT, 1, 1) * -1, op=op, group=group, bias=bias)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == [op]


def test_scale_over_h_is_refused(tmp_path):
    out = optimize(tmp_path, conv_then("Mul", per_channel(SIDE, 1)), [PASS])
    assert out.ops == ["Conv", "Mul"]
    assert out.refused("has shape [6, 1], not one value per output channel")


def test_divisor_with_zeros_is_refused(tmp_path):
    divisor = per_channel(C_OUT, 1, 1)
    divisor[3] = 0
    out = optimize(tmp_path, conv_then("Div", divisor), [PASS], check=False)
    assert out.ops == ["Conv", "Div"] and out.refused("has zeros")
