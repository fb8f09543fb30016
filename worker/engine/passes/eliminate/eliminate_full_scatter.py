"""eliminate_full_scatter: a ScatterND whose constant indices write every element of its data, in order, is its
updates reshaped to the data's shape.

    data:[1, 1, 256, 16] -> ScatterND(indices = every position in row-major order, updates) -> y
        becomes    updates -> Reshape(1, 1, 256, 16) -> y        (the data no longer read)

The TorchScript exporter writes an in-place slice assignment ``attn[:, :, s:, s:] = bias`` as a ScatterND over
the sliced positions; when the slice starts at 0 (MViTv2's attention without a class token) it covers the
whole tensor, and the data it writes into is overwritten entirely. Exact: with reduction "none" each position
takes the update written there, and indices listing the positions in row-major order pair update i with
position i, which is what a Reshape of the updates does. eliminate_nop_reshape drops the Reshape when the
updates already have the data's shape.

Preconditions: indices known offline; the data's shape static; the indices, flattened to one row of
k coordinates per update slice, are exactly every k-tuple over the data's first k dims in row-major order;
reduction "none" (or absent).
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.shapes import lists_every_position, reshape_instead, static_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

#: The largest index tensor compared against the full grid (larger ones are left as they are).
MAX_INDICES = 1 << 22


class FullScatter(Rule):
    name = "eliminate_full_scatter"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.ScatterND(p.var("data"), p.var("indices"), p.var("updates"), key="scatter", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> list[int] | str:
        scatter = match.node("scatter")
        reduction = scatter.attr("reduction", "none")
        if (reduction.decode() if isinstance(reduction, bytes) else reduction) != "none":
            return f"it reduces ({reduction}) into the data, which it reads"
        shape = static_shape(match.value("data"))
        if shape is None:
            return "the data's shape is not static"
        indices = match.value("indices").constant_value()
        if indices is None:
            return "its indices are not known offline"
        if indices.ndim < 1 or indices.size > MAX_INDICES:
            return "its indices are too large to compare with every position"
        if not lists_every_position(indices, tuple(shape)):
            return "its indices do not write every position of the data in order"
        return list(shape)

    def rewrite(self, ctx: PassContext, match: Match, shape: list[int]) -> Node:
        return reshape_instead(match.node("scatter"), match.graph, match.value("updates"), match.value("y"), shape)


@register_pass(name="eliminate_full_scatter", kind=PassKind.PROGRAM, level=1,
               description="ScatterND whose constant indices write every element in order -> its updates "
                           "reshaped")
def eliminate_full_scatter(ctx: PassContext) -> PassResult:
    if ctx.opset() < 11:
        return PassResult()  # ScatterND is opset 11
    return apply_rules(ctx, [FullScatter()])
