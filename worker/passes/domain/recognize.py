"""Recognising the activation applied to a value, as one op or in the decomposed forms exporters write.

    Relu, Sigmoid, Tanh, HardSwish, LeakyRelu, HardSigmoid, Gelu (exact)   the op itself
    Clip(y, 0, 6) -> Relu6; Clip(y, 0, +inf) -> Relu                        other bounds are refused
    y * Sigmoid(y) -> Silu
    y * HardSigmoid(y, 1/6, 1/2) -> HardSwish                               other alpha/beta are refused
    y * Clip(y + 3, 0, 6) / 6 -> HardSwish      (the division also as * 1/6, before or after the product)
    y * 0.5 * (1 + Erf(y / sqrt(2))) -> Gelu    (the three orders of the product; / sqrt(2) also as a *)

A recogniser only reads the structure and the constants; whether the nodes are used by anyone else is the
fusion's check (``exclusive_use``), so that a refusal can say which node holds on to which value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from worker.ir import Node, Value
from worker.passes.domain.activations import ALPHA, BETA

_RTOL = 1e-5


@dataclass
class Recognized:
    kind: str
    nodes: list[Node]
    output: Value
    params: dict[str, float] = field(default_factory=dict)


@dataclass
class Refused:
    kind: str
    reason: str


Recognizer = Callable[[Value, int], "Recognized | Refused | None"]


# --- small readers --------------------------------------------------------------------------------------
def scalar(value: Value | None) -> float | None:
    """The one number a constant holds (every element equal), or None."""
    data = None if value is None else value.constant_value()
    if data is None or data.size == 0 or data.dtype.kind not in "fiu":
        return None
    flat = np.asarray(data).reshape(-1)
    first = flat[0]
    return float(first) if np.all(flat == first) else None


def close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=_RTOL, abs_tol=1e-7)


def consumer(value: Value, op_type: str, reads_at: int | None = None) -> Node | None:
    """The first standard node of ``op_type`` reading ``value`` (at slot ``reads_at`` if given)."""
    for use in value.uses:
        node = use.node
        if node.op_type == op_type and node.domain == "" and (reads_at is None or use.slot == reads_at):
            return node
    return None


def other_operand(node: Node, value: Value) -> Value | None:
    """The input of a binary node that is not ``value`` (None when ``value`` is not exactly one of them)."""
    a, b = node.input(0), node.input(1)
    if a is value and b is not value:
        return b
    if b is value and a is not value:
        return a
    return None


def mul_with(value: Value, partner: Value) -> Node | None:
    """A Mul reading ``value`` and ``partner`` in either order."""
    for use in value.uses:
        node = use.node
        if node.op_type == "Mul" and node.domain == "" and other_operand(node, value) is partner:
            return node
    return None


def scaled_by(value: Value, factor: float) -> Node | None:
    """A node computing value * factor or value / (1 / factor), with a constant factor."""
    for use in value.uses:
        node = use.node
        if node.domain != "":
            continue
        if node.op_type == "Mul" and close(scalar(other_operand(node, value)), factor):
            return node
        if node.op_type == "Div" and use.slot == 0 and close(scalar(node.input(1)), 1.0 / factor):
            return node
    return None


def clip_bounds(node: Node, opset: int) -> tuple[float | None, float | None] | None:
    """(min, max) of a Clip, None for an absent bound; None when a bound is not a constant."""
    if opset < 11:
        low, high = node.attr("min"), node.attr("max")
        low = None if low is None or low <= -3.4e38 else float(low)
        high = None if high is None or high >= 3.4e38 else float(high)
        return low, high
    bounds = []
    for slot in (1, 2):
        source = node.input(slot)
        if source is None:
            bounds.append(None)
            continue
        number = scalar(source)
        if number is None:
            return None
        bounds.append(number)
    return bounds[0], bounds[1]


def _show(number: float | None) -> str:
    return "none" if number is None else f"{number:g}"


# --- the forms ------------------------------------------------------------------------------------------
_SIMPLE = {"Relu", "Sigmoid", "Tanh", "HardSwish"}


def single_op(y: Value, opset: int) -> Recognized | Refused | None:
    for use in y.uses:
        node = use.node
        if node.domain != "" or use.slot != 0:
            continue
        kind = node.op_type
        if kind in _SIMPLE:
            return Recognized(kind, [node], node.output(0))
        if kind == "LeakyRelu":
            return Recognized(kind, [node], node.output(0), {ALPHA: float(node.attr("alpha", 0.01))})
        if kind == "HardSigmoid":
            return Recognized(kind, [node], node.output(0),
                              {ALPHA: float(node.attr("alpha", 0.2)), BETA: float(node.attr("beta", 0.5))})
        if kind == "Gelu":
            approximate = node.attr("approximate", "none")
            if approximate != "none":
                return Refused("Gelu", f"Gelu with approximate={approximate!r} is not the exact Gelu")
            return Recognized(kind, [node], node.output(0))
        if kind == "Clip":
            return _clip(node, opset)
    return None


def _clip(node: Node, opset: int) -> Recognized | Refused:
    bounds = clip_bounds(node, opset)
    if bounds is None:
        return Refused("Relu6", "the Clip bounds are not constant scalars")
    low, high = bounds
    if low == 0.0 and high == 6.0:
        return Recognized("Relu6", [node], node.output(0))
    if low == 0.0 and high is None:
        return Recognized("Relu", [node], node.output(0))
    return Refused("Relu6", f"Clip({_show(low)}, {_show(high)}) is not Relu6, which is Clip(0, 6)")


def silu(y: Value, opset: int) -> Recognized | None:
    sigmoid = consumer(y, "Sigmoid", reads_at=0)
    product = sigmoid and mul_with(sigmoid.output(0), y)
    if product is None:
        return None
    return Recognized("Silu", [sigmoid, product], product.output(0))


def hard_swish_by_hard_sigmoid(y: Value, opset: int) -> Recognized | Refused | None:
    gate = consumer(y, "HardSigmoid", reads_at=0)
    product = gate and mul_with(gate.output(0), y)
    if product is None:
        return None
    alpha, beta = float(gate.attr("alpha", 0.2)), float(gate.attr("beta", 0.5))
    if not (close(alpha, 1.0 / 6.0) and close(beta, 0.5)):
        return Refused("HardSwish", f"HardSigmoid(alpha={alpha:g}, beta={beta:g}) times its input is not "
                                    f"HardSwish, which needs alpha=1/6 and beta=0.5")
    return Recognized("HardSwish", [gate, product], product.output(0))


def hard_swish_by_clip(y: Value, opset: int) -> Recognized | Refused | None:
    """y * Clip(y + 3, 0, 6) / 6, with the division before or after the product."""
    for use in y.uses:
        shift = use.node
        if shift.op_type != "Add" or shift.domain != "":
            continue
        clip = consumer(shift.output(0), "Clip", reads_at=0)
        if clip is None:
            continue
        scale = scaled_by(clip.output(0), 1.0 / 6.0)
        product = scale and mul_with(scale.output(0), y)
        if product is not None:  # y * (Clip(...) / 6)
            nodes, output = [shift, clip, scale, product], product.output(0)
        else:  # (y * Clip(...)) / 6
            product = mul_with(clip.output(0), y)
            scale = product and scaled_by(product.output(0), 1.0 / 6.0)
            if scale is None:
                continue
            nodes, output = [shift, clip, product, scale], scale.output(0)
        offset, bounds = scalar(other_operand(shift, y)), clip_bounds(clip, opset)
        if not close(offset, 3.0) or bounds != (0.0, 6.0):
            low, high = bounds or (None, None)
            return Refused("HardSwish", f"y * Clip(y + {_show(offset)}, {_show(low)}, {_show(high)}) / 6 is "
                                        f"not HardSwish, which is y * Clip(y + 3, 0, 6) / 6")
        return Recognized("HardSwish", nodes, output)
    return None


def gelu_by_erf(y: Value, opset: int) -> Recognized | None:
    """y * 0.5 * (1 + Erf(y / sqrt(2))) in any of the three orders of the product."""
    shrink = scaled_by(y, 1.0 / math.sqrt(2.0))
    erf = shrink and consumer(shrink.output(0), "Erf")
    one_plus = erf and consumer(erf.output(0), "Add")
    if one_plus is None or not close(scalar(other_operand(one_plus, erf.output(0))), 1.0):
        return None
    head = [shrink, erf, one_plus]
    u = one_plus.output(0)
    for use in u.uses:
        first = use.node
        if first.op_type != "Mul" or first.domain != "":
            continue
        partner = other_operand(first, u)
        if close(scalar(partner), 0.5):  # y * (0.5 * u)
            last = mul_with(first.output(0), y)
            if last is not None:
                return Recognized("Gelu", head + [first, last], last.output(0))
        elif partner is y:  # (y * u) * 0.5
            last = scaled_by(first.output(0), 0.5)
            if last is not None:
                return Recognized("Gelu", head + [first, last], last.output(0))
        elif partner is not None and partner.producer is not None:  # (y * 0.5) * u
            half = partner.producer
            if half.op_type == "Mul" and half.domain == "" and close(scalar(other_operand(half, y)), 0.5):
                return Recognized("Gelu", head + [half, first], first.output(0))
    return None


#: Compound forms first: their first node (Sigmoid, HardSigmoid) would otherwise be taken alone.
FORMS: tuple[Recognizer, ...] = (gelu_by_erf, hard_swish_by_clip, hard_swish_by_hard_sigmoid, silu, single_op)


def recognize(y: Value, opset: int) -> Recognized | Refused | None:
    """The activation applied to ``y``, a refusal when it looks like one but is not, or None."""
    for form in FORMS:
        found = form(y, opset)
        if found is not None:
            return found
    return None


def exclusive_use(y: Value, found: Recognized) -> str | None:
    """None when only the activation's nodes read ``y`` and its intermediates, else a sentence why not."""
    inside = {id(node) for node in found.nodes}
    if y.is_graph_output:
        return f"its output {y.name!r} is also a graph output"
    for value in [y] + [out for node in found.nodes for out in node.outputs if out is not found.output]:
        if value is not y and value.is_graph_output:
            return f"the intermediate {value.name!r} is also a graph output"
        for use in value.uses:
            if id(use.node) not in inside:
                what = "its output" if value is y else "the intermediate"
                return f"{what} {value.name!r} is also read by {use.node.op_type} {use.node.name!r}"
    return None
