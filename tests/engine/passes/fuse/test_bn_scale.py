"""bn_scale_fuse: per-channel Mul/Div/Add/Sub after BatchNormalization fold into its scale and bias."""
from __future__ import annotations

import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fuse.builders import C_OUT, SIDE, per_channel
from tests.engine.passes.fuse.harness import optimize
from tests.engine.passes.fuse.test_conv_bn import bn_node, bn_tensors

PASS = "bn_scale_fuse"
SHAPE = [1, C_OUT, SIDE, SIDE]


def bn_then(*steps, gamma_input=False):
    """x -> BatchNormalization -> each (op, constant) in turn -> y."""
    nodes, inits, last = [bn_node("x", "t0")], bn_tensors(C_OUT), "t0"
    inputs = [vinfo("x", shape=SHAPE)]
    if gamma_input:
        inits = inits[1:]
        inputs.append(vinfo("bn_scale", shape=[C_OUT]))
    for i, (op, constant) in enumerate(steps):
        out = "y" if i == len(steps) - 1 else f"t{i + 1}"
        inits.append(tensor(f"k{i}", constant))
        nodes.append(helper.make_node(op, [last, f"k{i}"], [out], name=f"{op.lower()}{i}"))
        last = out
    return make_model(nodes, inputs, [vinfo("y", shape=SHAPE)], inits)


def test_mul_then_add_fold_into_the_batchnorm(tmp_path):
    model = bn_then(("Mul", per_channel(C_OUT, 1, 1) * -1), ("Add", per_channel(1, C_OUT, 1, 1)))
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["BatchNormalization"] and out.rewrites(PASS) == 2
    assert out.node("BatchNormalization").attr("epsilon") == pytest.approx(0.05)
    assert len(out.model.graph.initializers) == 4


@pytest.mark.parametrize("op", ["Div", "Sub"])
def test_div_and_sub(tmp_path, op):
    out = optimize(tmp_path, bn_then((op, per_channel(1))), [PASS])
    assert out.ops == ["BatchNormalization"]


def test_constant_varying_over_w_is_refused(tmp_path):
    out = optimize(tmp_path, bn_then(("Mul", per_channel(SIDE))), [PASS])
    assert out.ops == ["BatchNormalization", "Mul"]
    assert out.refused("has shape [6], not one value per channel")


def test_scale_that_is_not_a_constant_is_refused(tmp_path):
    out = optimize(tmp_path, bn_then(("Add", per_channel(C_OUT, 1, 1)), gamma_input=True), [PASS])
    assert out.ops == ["BatchNormalization", "Add"]
    assert out.refused("the scale of BatchNormalization 'bn' ('bn_scale') is not a constant")
