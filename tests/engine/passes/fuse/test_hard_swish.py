"""hard_swish_fuse: x*HardSigmoid(x) and paddle2onnx's x*Clip(x+3,0,6)/6 -> HardSwish (14+) or fewer nodes."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import optimize

PASS = "hard_swish_fuse"
X = [1, 4, 5, 5]


def clip_form(order="mul_div", *, opset=14, high=6.0):
    """x -> Add 3 -> Clip(0, high) -> ... as paddle2onnx writes it (Constant nodes for every constant)."""
    consts = {"three": 3.0, "low": 0.0, "high": high, "six": 6.0 if order in ("mul_div", "div_mul") else 1 / 6}
    nodes = [helper.make_node("Constant", [], [k], value=tensor(k, np.float32(v))) for k, v in consts.items()]
    nodes.append(helper.make_node("Add", ["x", "three"], ["s"]))
    if opset >= 11:
        nodes.append(helper.make_node("Clip", ["s", "low", "high"], ["c"], name="clip"))
    else:
        nodes = [n for n in nodes if n.output[0] not in ("low", "high")]
        nodes.append(helper.make_node("Clip", ["s"], ["c"], name="clip", min=0.0, max=high))
    scale = "Div" if order in ("mul_div", "div_mul") else "Mul"
    if order in ("mul_div", "mul_mul"):
        nodes += [helper.make_node("Mul", ["c", "x"], ["m"]), helper.make_node(scale, ["m", "six"], ["y"])]
    else:
        nodes += [helper.make_node(scale, ["c", "six"], ["m"]), helper.make_node("Mul", ["x", "m"], ["y"])]
    return inferred_model(nodes, [vinfo("x", shape=X)], ["y"], opset=opset)


@pytest.mark.parametrize("order", ["mul_div", "mul_mul", "div_mul", "mul_mul_inner"])
def test_clip_form_becomes_hard_swish(tmp_path, order):
    out = optimize(tmp_path, clip_form(order), [PASS])
    assert out.ops == ["HardSwish"] and out.rewrites(PASS) == 1


@pytest.mark.parametrize("opset", [9, 12])
def test_clip_form_becomes_hard_sigmoid_times_x_before_opset_14(tmp_path, opset):
    out = optimize(tmp_path, clip_form(opset=opset), [PASS])
    assert out.ops == ["HardSigmoid", "Mul"]
    gate = out.node("HardSigmoid")
    assert gate.attr("alpha") == pytest.approx(1 / 6) and gate.attr("beta") == pytest.approx(0.5)
    assert gate.output().dtype and gate.output().shape == tuple(X)


def test_clip_with_other_bounds_is_refused(tmp_path):
    out = optimize(tmp_path, clip_form(high=5.0), [PASS])
    assert "HardSwish" not in out.ops and out.refused("y * Clip(y + 3, 0, 5) / 6 is not HardSwish, which is y * Clip(y + 3, 0, 6) / 6")


def hard_sigmoid_form(opset, alpha=1 / 6):
    nodes = [helper.make_node("HardSigmoid", ["x"], ["g"], alpha=alpha, beta=0.5, name="hs"),
             helper.make_node("Mul", ["g", "x"], ["y"])]
    return inferred_model(nodes, [vinfo("x", shape=X)], ["y"], opset=opset)


def test_x_times_hard_sigmoid_becomes_hard_swish(tmp_path):
    out = optimize(tmp_path, hard_sigmoid_form(14), [PASS])
    assert out.ops == ["HardSwish"]


def test_opset_gate_and_other_alpha_are_refused(tmp_path):
    out = optimize(tmp_path, hard_sigmoid_form(13), [PASS])
    assert out.ops == ["HardSigmoid", "Mul"] and out.refused("HardSwish needs opset 14")
    out = optimize(tmp_path, hard_sigmoid_form(14, alpha=0.2), [PASS])
    assert out.ops == ["HardSigmoid", "Mul"] and out.refused("HardSigmoid(alpha=0.2, beta=0.5) times its input is not HardSwish")
