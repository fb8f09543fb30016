"""eliminate_flatten_after_innerproduct: a Flatten(axis=1) of a Gemm output is removed.

    x -> Gemm -> g:[N,M] -> Flatten(axis=1) -> y:[N,M]    becomes    x -> Gemm -> g

(ncnn's eliminate_flatten_after_innerproduct.) A Gemm output has rank 2, so flattening it from axis 1 (or -1)
changes nothing, whatever N is. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


def flattens_from_axis_1(node: Node) -> bool:
    """flattens from axis 1"""
    return node.attr("axis", 1) in (1, -1)


class FlattenAfterGemmRule(Rule):
    name = "eliminate_flatten_after_innerproduct"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        g = p.Gemm(out="g").keep()
        p.Flatten(g, when=flattens_from_axis_1)
        return p

    def check(self, ctx: PassContext, match: Match) -> Value:
        return match.value("g")


@register_pass(name="eliminate_flatten_after_innerproduct", peer="ncnn", kind=PassKind.PROGRAM, level=1,
               description="remove Flatten(axis=1) after Gemm, whose output is already 2-D")
def eliminate_flatten_after_innerproduct(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [FlattenAfterGemmRule()])
