"""gelu_fuse: Gelu written out with Erf (or its tanh approximation) becomes the Gelu op (opset 20+).

    0.5 * x * (1 + Erf(x / sqrt(2)))                                   ->  Gelu(x)
    0.5 * x * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x ^ 3)))       ->  Gelu(x, approximate="tanh")

The product may be spelled in any of the three orders exporters use ((x * a) * 0.5, x * (a * 0.5),
(x * 0.5) * a) and x / sqrt(2) as x * (1 / sqrt(2)). The constants must match to a relative 1e-3.
Refused before opset 20, where Gelu does not exist (onnxruntime's own Gelu is a contrib op, out of scope for
standard-op output).
"""
from __future__ import annotations

import math

import numpy as np

from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.fuse.rewrite import FusionRule, describe, graph_of, run_rules
from worker.passes.fuse.weights import FLOAT_TYPES
from worker.passes.registry import register_pass
from worker.pattern import Match, Pattern

TAILS = ("x_a_half", "a_half_x", "x_half_a")
EXPECTED = {"half": 0.5, "one": 1.0, "cube": 3.0, "cubic": 0.044715, "sqrt_2_pi": math.sqrt(2 / math.pi)}


def scalar(match: Match, key: str) -> float | None:
    data = match.value(key).constant_value()
    return None if data is None or data.size != 1 else float(np.reshape(data, -1)[0])


def close(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) <= 1e-3 * abs(expected)


class GeluChain(FusionRule):
    def __init__(self, form: str, scaling: str, tail: str):
        super().__init__()
        self.form, self.scaling, self.tail = form, scaling, tail
        self.name = f"gelu_{form}" + (f"_{scaling}" if form == "erf" else "") + f"_{tail}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x, inner, act = p.var("x"), p.var("inner"), p.var("act")
        p.op("nonlinear", "Erf" if self.form == "erf" else "Tanh", inputs=[inner], outputs=[act])
        if self.form == "erf":
            p.op("scale_in", self.scaling, inputs=[x, p.var("root").const()], outputs=[inner],
                 commutative=self.scaling == "Mul")
        else:
            cube, cubic, summed = p.var("x3"), p.var("cx3"), p.var("sum")
            p.op("pow", "Pow", inputs=[x, p.var("cube").const()], outputs=[cube])
            p.op("mul_cubic", "Mul", inputs=[cube, p.var("cubic").const()], outputs=[cubic], commutative=True)
            p.op("add_x", "Add", inputs=[x, cubic], outputs=[summed], commutative=True)
            p.op("scale_in", "Mul", inputs=[summed, p.var("sqrt_2_pi").const()], outputs=[inner], commutative=True)
        a = p.var("a")
        p.op("add_one", "Add", inputs=[act, p.var("one").const()], outputs=[a], commutative=True)
        self._tail(p, x, a)
        return p

    def _tail(self, p: Pattern, x, a) -> None:
        m, out, half = p.var("m"), p.var("out"), p.var("half").const()
        first, second = {"x_a_half": ([x, a], [m, half]), "a_half_x": ([a, half], [x, m]),
                         "x_half_a": ([x, half], [m, a])}[self.tail]
        p.op("mul_first", "Mul", inputs=first, outputs=[m], commutative=True)
        p.op("mul_second", "Mul", inputs=second, outputs=[out], commutative=True)

    def check(self, ctx: PassContext, match: Match) -> str | None:
        if ctx.opset() < 20:
            return f"Gelu needs opset 20, and the model imports opset {ctx.opset()}"
        if match.value("x").dtype not in FLOAT_TYPES:
            return f"the input of the Gelu chain at {describe(match.node('nonlinear'))} is not a float tensor"
        expected = dict(EXPECTED)
        if self.form == "erf":
            expected["root"] = math.sqrt(2) if self.scaling == "Div" else 1 / math.sqrt(2)
        for key, value in expected.items():
            if key in match and not close(scalar(match, key), value):
                return (f"the constant {match.value(key).name!r} of the chain at {describe(match.node('nonlinear'))} "
                        f"is not {value:.6g}, so the chain is not Gelu")
        return None

    def rewrite(self, ctx: PassContext, match: Match):
        attributes = {"approximate": "tanh"} if self.form == "tanh" else {}
        self.orphan(*(match.value(k) for k in ("root", "cube", "cubic", "sqrt_2_pi", "one", "half") if k in match))
        return graph_of(match).add_node("Gelu", [match.value("x")], outputs=[match.value("out")],
                                        name=match.node("nonlinear").name, attributes=attributes,
                                        before=match.node("mul_second"))


@register_pass(name="gelu_fuse", kind=PassKind.PROGRAM, level=1,
               description="turn Gelu written out with Erf or Tanh into the Gelu op (opset 20+)")
def gelu_fuse(ctx: PassContext) -> PassResult:
    rules = [GeluChain("erf", scaling, tail) for scaling in ("Div", "Mul") for tail in TAILS]
    return run_rules(ctx, rules + [GeluChain("tanh", "", tail) for tail in TAILS])
