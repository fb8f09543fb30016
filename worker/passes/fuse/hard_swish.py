"""hard_swish_fuse: hard-swish written out becomes HardSwish (opset 14+), or x * HardSigmoid(x) before that.

    Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))           ->  HardSwish(x)                    (opset 14+)
    x * Clip(x + 3, 0, 6) / 6                              ->  HardSwish(x)                    (opset 14+)
                                                           ->  Mul(x, HardSigmoid(x, 1/6, 0.5))  (before 14)

The second form is how paddle2onnx writes Paddle's hard_swish (Add, Clip, Mul, Div: PP-OCR models are full
of it), in four orders: (x * c) / 6, (x * c) * (1/6), x * (c / 6), x * (c * (1/6)). HardSigmoid has existed
since opset 6, so older models still lose two of the four nodes. Clip's bounds are attributes before opset 11
and inputs from 11. Constants must match to a relative 1e-5.
"""
from __future__ import annotations

import numpy as np

from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.fuse.rewrite import FusionRule, describe, graph_of, new_value, run_rules
from worker.passes.fuse.weights import FLOAT_TYPES
from worker.passes.registry import register_pass
from worker.pattern import Match, Pattern

ALPHA, BETA = 1.0 / 6.0, 0.5
ORDERS = ("mul_div", "mul_mul", "div_mul", "mul_mul_inner")


def close(value, expected: float) -> bool:
    return value is not None and abs(float(value) - expected) <= 1e-5 * max(1.0, abs(expected))


def scalar(value) -> float | None:
    data = None if value is None else value.constant_value()
    return None if data is None or data.size != 1 else float(np.reshape(data, -1)[0])


def clip_bounds(clip, opset: int) -> tuple[float | None, float | None]:
    if opset < 11:
        return clip.attr("min", float("-inf")), clip.attr("max", float("inf"))
    low = float("-inf") if clip.input(1) is None else scalar(clip.input(1))
    high = float("inf") if clip.input(2) is None else scalar(clip.input(2))
    return low, high


class HardSigmoidMul(FusionRule):
    name = "hard_sigmoid_mul"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x, gate = p.var("x"), p.var("gate")
        p.op("hard_sigmoid", "HardSigmoid", inputs=[x], outputs=[gate])
        p.op("mul", "Mul", inputs=[x, gate], outputs=[p.var("out")], commutative=True)
        return p

    def check(self, ctx: PassContext, match: Match) -> str | None:
        node = match.node("hard_sigmoid")
        if not (close(node.attr("alpha", 0.2), ALPHA) and close(node.attr("beta", 0.5), BETA)):
            return f"{describe(node)} has alpha {node.attr('alpha', 0.2):.6g}, beta {node.attr('beta', 0.5):.6g}, " \
                   f"not 1/6 and 0.5, so x times it is not hard-swish"
        if ctx.opset() < 14:
            return (f"HardSwish needs opset 14, and the model imports opset {ctx.opset()} "
                    f"(x * HardSigmoid(x) is the shortest spelling there)")
        return None

    def rewrite(self, ctx: PassContext, match: Match):
        return graph_of(match).add_node("HardSwish", [match.value("x")], outputs=[match.value("out")],
                                        name=match.node("hard_sigmoid").name, before=match.node("mul"))


class ClipHardSwish(FusionRule):
    """x * Clip(x + 3, 0, 6) / 6 in one of four orders."""

    def __init__(self, order: str):
        super().__init__()
        self.order, self.name = order, f"clip_hard_swish_{order}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x, shifted, clipped, mid, six = p.var("x"), p.var("shifted"), p.var("clipped"), p.var("mid"), p.var("six")
        p.op("clip", "Clip", inputs=[shifted], outputs=[clipped])
        p.op("add", "Add", inputs=[x, p.var("three").const()], outputs=[shifted], commutative=True)
        scale = "Div" if self.order in ("mul_div", "div_mul") else "Mul"
        if self.order in ("mul_div", "mul_mul"):
            p.op("mul", "Mul", inputs=[x, clipped], outputs=[mid], commutative=True)
            p.op("scale", scale, inputs=[mid, six.const()], outputs=[p.var("out")], commutative=scale == "Mul")
        else:
            p.op("scale", scale, inputs=[clipped, six.const()], outputs=[mid], commutative=scale == "Mul")
            p.op("mul", "Mul", inputs=[x, mid], outputs=[p.var("out")], commutative=True)
        return p

    def check(self, ctx: PassContext, match: Match) -> str | None:
        clip = match.node("clip")
        low, high = clip_bounds(clip, ctx.opset())
        divisor = 6.0 if match.node("scale").op_type == "Div" else ALPHA
        if not (close(scalar(match.value("three")), 3.0) and close(low, 0.0) and close(high, 6.0)
                and close(scalar(match.value("six")), divisor)):
            return f"the constants around {describe(clip)} are not those of x * Clip(x + 3, 0, 6) / 6"
        if match.value("x").dtype not in FLOAT_TYPES:
            return f"the input of the hard-swish at {describe(clip)} is not a float tensor"
        return None

    def rewrite(self, ctx: PassContext, match: Match):
        x, out, graph = match.value("x"), match.value("out"), graph_of(match)
        clip = match.node("clip")
        self.orphan(match.value("three"), match.value("six"), *clip.inputs[1:])
        if ctx.opset() >= 14:
            return graph.add_node("HardSwish", [x], outputs=[out], name=clip.name, before=match.node("mul"))
        gate = graph.add_node("HardSigmoid", [x], outputs=[new_value(graph, f"{clip.name}_gate", x)],
                              name=clip.name, attributes={"alpha": ALPHA, "beta": BETA}, before=clip)
        return [gate, graph.add_node("Mul", [x, gate.output()], outputs=[out], name=match.node("mul").name,
                                     before=clip)]


@register_pass(name="hard_swish_fuse", kind=PassKind.PROGRAM, level=1,
               description="turn x * HardSigmoid(x) and x * Clip(x + 3, 0, 6) / 6 into HardSwish (opset 14+), "
                           "or the latter into x * HardSigmoid(x)")
def hard_swish_fuse(ctx: PassContext) -> PassResult:
    return run_rules(ctx, [ClipHardSwish(order) for order in ORDERS] + [HardSigmoidMul()])
