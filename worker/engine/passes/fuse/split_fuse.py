"""split_fuse: sibling Slices that tile a tensor along one axis become one Split (onnxruntime's extended level
does the same; a Split reads its input once and is one node).

    x:[..., 64, ...] -> Slice(0:16, axis) -> a            ->  Split(x, split=[16, 48], axis) -> a, b
                     -> Slice(16:64, axis) -> b

The exporters write the rotate-half of rotary embeddings (x[..., :d/2] and x[..., d/2:]), partial rotary
(q[..., :rot] and q[..., rot:]) and fused QKV projections this way. Preconditions: every Slice reading x
along that axis has constant starts and ends, step 1 and no other axis, the dim is static, and together
they cover it exactly once (sorted, contiguous, from 0 to the end; an empty slice or a gap refuses). The
Split takes the Slices' output values over, so names and readers stay. Exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.operands import slice_arguments
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

#: Opset from which Split takes ``split`` as an input instead of an attribute.
SPLIT_AS_INPUT_SINCE = 13


@dataclass(frozen=True)
class Piece:
    node: Node
    axis: int
    start: int
    end: int


@dataclass(frozen=True)
class Tiling:
    axis: int
    #: The Slices in the order of the parts they take.
    pieces: list[Piece]


def piece(node: Node, source: Value, opset: int) -> Piece | None:
    """The one-axis, step-1 part of ``source`` that the Slice ``node`` takes, clamped to the dim; else None."""
    arguments = slice_arguments(node, opset)
    if isinstance(arguments, str) or source.shape is None:
        return None
    starts, ends, axes, steps = arguments
    if len(starts) != 1 or len(ends) != 1 or any(step != 1 for step in steps or ()):
        return None
    axis = (axes or [0])[0] % len(source.shape)
    dim = source.shape[axis]
    if not isinstance(dim, int):
        return None
    start, end, _ = slice(starts[0], ends[0], 1).indices(dim)
    return Piece(node, axis, start, end) if start < end else None


def tiling(pieces: list[Piece], dim: int) -> list[Piece] | None:
    """``pieces`` sorted when they cover [0, dim) exactly once, else None."""
    ordered = sorted(pieces, key=lambda p: p.start)
    position = 0
    for part in ordered:
        if part.start != position:
            return None
        position = part.end
    return ordered if position == dim else None


class SiblingSlices(Rule):
    name = "slices_to_split"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Slice(p.var("x"), key="slice", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Tiling | str | None:
        x, first = match.value("x"), match.node("slice")
        mine = piece(first, x, ctx.opset())
        if mine is None:
            return None
        siblings = dict.fromkeys(use.node for use in x.uses if use.slot == 0 and use.node.op_type == "Slice"
                                 and use.node.domain == "" and use.node.graph is match.graph)
        pieces = [p for node in siblings if (p := piece(node, x, ctx.opset())) is not None and p.axis == mine.axis]
        if len(pieces) < 2:
            return None
        ordered = tiling(pieces, x.shape[mine.axis])
        if ordered is None:
            parts = ", ".join(f"{p.start}:{p.end}" for p in sorted(pieces, key=lambda p: p.start))
            return (f"the Slices of {x.name!r} along axis {mine.axis} ({parts}) do not cover its "
                    f"{x.shape[mine.axis]} elements exactly once, so {describe(first)} stays")
        return Tiling(mine.axis, ordered)

    def rewrite(self, ctx: PassContext, match: Match, plan: Tiling) -> Node:
        graph, nodes = match.graph, [p.node for p in plan.pieces]
        lengths = [p.end - p.start for p in plan.pieces]
        earliest = min(nodes, key=lambda n: n.position)
        attributes = {"axis": plan.axis}
        inputs = [match.value("x")]
        if ctx.opset() >= SPLIT_AS_INPUT_SINCE:
            inputs.append(graph.add_initializer(f"{earliest.name}_split", np.array(lengths, np.int64)))
        else:
            attributes["split"] = lengths
        split = graph.add_node("Split", inputs, outputs=[n.outputs[0] for n in nodes], name=f"{earliest.name}_split",
                               attributes=attributes, before=earliest)
        # The other Slices gave their outputs to the Split: they read x and produce nothing anyone reads.
        graph.remove_nodes([n for n in nodes if n is not match.node("slice")])
        return split


@register_pass(name="split_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn sibling Slices that tile a tensor along one axis into one Split")
def split_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [SiblingSlices()])
