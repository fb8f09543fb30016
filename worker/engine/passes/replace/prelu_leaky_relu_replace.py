"""prelu_leaky_relu_replace: a PRelu whose slope is one value becomes LeakyRelu (ncnn's
replace_prelu_with_leaky_relu): no slope tensor to read, a simpler kernel everywhere.

    PRelu(x, slope)  ->  LeakyRelu(x, alpha=slope)     (slope constant, every element equal)

Refused when the slope is not a constant, holds different values, or would enlarge x by broadcasting.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.placement import placement_refusal, planned_facts
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


class PReluOneSlope(Rule):
    name = "prelu_one_slope"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.PRelu(p.var("x"), p.var("slope"), key="prelu", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> float | str:
        """The one slope, or why there is not one."""
        prelu, x, slope = match.node("prelu"), match.value("x"), match.value("slope")
        data = slope.constant_value()
        if data is None:
            return f"the slope of {describe(prelu)} ({slope.name!r}) is not a constant"
        if data.size == 0 or not np.all(data == data.reshape(-1)[0]):
            return f"{describe(prelu)} has {len(np.unique(data))} different slopes"
        enlarges = x.rank is None or data.ndim > x.rank
        if not enlarges and data.size > 1:
            enlarges = not x.is_static or np.broadcast_shapes(data.shape, x.shape) != tuple(x.shape)
        if enlarges:
            return f"the slope of {describe(prelu)} may broadcast x to another shape"
        alpha = float(data.reshape(-1)[0])
        facts = planned_facts("LeakyRelu", "", ctx.opset(""), [x], [match.value("out")], {"alpha": alpha},
                              prelu.name)
        return placement_refusal(ctx, facts, match.nodes) or alpha

    def rewrite(self, ctx: PassContext, match: Match, alpha: float) -> Node:
        prelu = match.node("prelu")
        return match.graph.add_node("LeakyRelu", [match.value("x")], outputs=[match.value("out")],
                                    name=prelu.name, attributes={"alpha": alpha}, before=prelu)


@register_pass(name="prelu_leaky_relu_replace", peer="ncnn", kind=PassKind.PROGRAM, level=2,
               description="replace a PRelu with a single constant slope by LeakyRelu")
def prelu_leaky_relu_replace(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [PReluOneSlope()])
