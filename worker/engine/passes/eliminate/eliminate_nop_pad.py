"""eliminate_nop_pad: a Pad that adds nothing on any side is removed.

    x -> Pad(pads=[0, 0, 0, 0]) -> y    becomes    x

Pads are an attribute before opset 11 (``paddings`` in opset 1) and a constant input from it on; every pad
must be zero, whatever the mode. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import int_list
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class NopPadRule(Rule):
    name = "eliminate_nop_pad"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Pad(p.var("x"), key="pad")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        node = match.node("pad")
        if ctx.opset() >= 11:
            pads = int_list(node.input(1))
            if pads is None:
                return "its pads are not known at optimization time"
        else:
            pads = node.attr("pads", node.attr("paddings"))
            if pads is None:
                return "it has no pads attribute"
        return match.value("x") if all(int(p) == 0 for p in pads) else None


@register_pass(name="eliminate_nop_pad", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Pad whose pads are all zero")
def eliminate_nop_pad(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopPadRule()])
