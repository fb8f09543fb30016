"""fuse_consecutive_slices: a Slice of a Slice's output over other axes is one Slice of both.

    x -> Slice(starts=[0], ends=[8], axes=[1]) -> t -> Slice(starts=[0], ends=[8], axes=[2]) -> y
        becomes    x -> Slice(starts=[0, 0], ends=[8, 8], axes=[1, 2]) -> y

Each axis is sliced on its own, against its own extent, and a Slice keeps the extent of every axis it does not
slice: the second Slice's ranges mean the same read against ``x``. timm's TinyViT exported by dynamo crops each
padded attention window twice, once per spatial axis (onnxoptimizer's fuse_consecutive_slices). Preconditions:
opset 10 or later (starts, ends, axes and steps as inputs), every argument constant, the input's rank known,
no axis sliced by both, and the first Slice read by the second alone. The second Slice is changed in place.
Exact.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import slice_arguments
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

#: Slice takes its ranges as inputs from this opset on.
INPUTS_SINCE = 10


def ranges(node: Node, rank: int, opset: int) -> list[tuple[int, int, int, int]] | str:
    """(axis, start, end, step) per sliced axis, axes non-negative, or why they are not known."""
    arguments = slice_arguments(node, opset)
    if isinstance(arguments, str):
        return arguments
    starts, ends, axes, steps = arguments
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps) or not all(-rank <= a < rank for a in axes):
        return "its starts, ends, axes and steps do not describe one range per axis"
    return [(a % rank, s, e, step) for a, s, e, step in zip(axes, starts, ends, steps)]


class ConsecutiveSlices(Rule):
    name = "fuse_consecutive_slices"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.Slice(p.var("x"), key="first", out="t")
        p.Slice(t, key="second")
        return p

    def check(self, ctx: PassContext, match: Match) -> list[tuple[int, int, int, int]] | str:
        rank = match.value("x").rank
        if rank is None:
            return "the rank of its input is not known"
        first = ranges(match.node("first"), rank, ctx.opset())
        second = ranges(match.node("second"), rank, ctx.opset())
        for found in (first, second):
            if isinstance(found, str):
                return found
        if {r[0] for r in first} & {r[0] for r in second}:
            return "both Slices slice the same axis"
        return first + second

    def rewrite(self, ctx: PassContext, match: Match, merged: list[tuple[int, int, int, int]]) -> None:
        second, graph = match.node("second"), match.graph
        arguments = [graph.root.add_initializer(f"{second.name}_{what}", np.array(column, dtype=np.int64))
                     for what, column in zip(("axes", "starts", "ends", "steps"), zip(*merged))]
        axes, starts, ends, steps = arguments
        second.set_input(0, match.value("x"))
        for slot, value in ((1, starts), (2, ends), (3, axes), (4, steps)):
            second.set_input(slot, value)


@register_pass(name="fuse_consecutive_slices", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="a Slice of a Slice's output over other axes becomes one Slice of both")
def fuse_consecutive_slices(ctx: PassContext) -> PassResult:
    if ctx.opset() < INPUTS_SINCE:
        return PassResult()  # ranges are attributes before opset 10: left as they are
    return apply_rules(ctx, [ConsecutiveSlices()])
