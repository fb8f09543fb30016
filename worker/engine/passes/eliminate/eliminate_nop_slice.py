"""eliminate_nop_slice: a Slice that takes every element of every axis, in order, is removed.

    x:[N,64] -> Slice(starts=[0], ends=[INT_MAX], axes=[1]) -> y    becomes    x

Starts, ends, axes and steps are attributes before opset 10 and constant inputs from it on. Every step must
be 1 and every sliced axis covered from its first to its last element: known from a static dim, or from a
start of 0 and an end at or beyond 2**31 - 1 when the dim is symbolic. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import slice_arguments
from worker.engine.passes.support.shapes import same_dim
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

INT32_MAX = 2**31 - 1


def covers_axis(start: int, end: int, dim) -> bool:
    if isinstance(dim, int):
        return slice(start, end, 1).indices(dim) == (0, dim, 1)
    return start == 0 and end >= INT32_MAX


class NopSliceRule(Rule):
    name = "eliminate_nop_slice"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Slice(p.var("x"), key="slice", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        arguments = slice_arguments(match.node("slice"), ctx.opset())
        if isinstance(arguments, str):
            return arguments
        starts, ends, axes, steps = arguments
        source, out = match.value("x"), match.value("y")
        if source.rank is None:
            return "the rank of its input is not known"
        axes = list(range(len(starts))) if axes is None else [a % source.rank for a in axes]
        if any(step != 1 for step in steps or ()):
            return None
        for start, end, axis in zip(starts, ends, axes):
            full = covers_axis(start, end, source.shape[axis])
            if not full and not (out.shape is not None and same_dim(out.shape[axis], source.shape[axis])):
                return None
        return source


@register_pass(name="eliminate_nop_slice", kind=PassKind.PROGRAM, level=1,
               description="remove Slice that keeps every element of every axis")
def eliminate_nop_slice(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopSliceRule()])
