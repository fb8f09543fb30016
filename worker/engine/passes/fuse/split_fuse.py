"""split_fuse: sibling Slices that tile a tensor along one axis, and a SplitToSequence read only by SequenceAt
at constant positions, become one Split (onnxruntime's extended level does the first; a Split reads its input
once, is one node, and needs no sequence type).

    x:[..., 64, ...] -> Slice(0:16, axis) -> a            ->  Split(x, split=[16, 48], axis) -> a, b
                     -> Slice(16:64, axis) -> b

The exporters write the rotate-half of rotary embeddings (x[..., :d/2] and x[..., d/2:]), partial rotary
(q[..., :rot] and q[..., rot:]) and fused QKV projections this way. Preconditions: every Slice reading x
along that axis has constant starts and ends, step 1 and no other axis, the dim is static, and together
they cover it exactly once (sorted, contiguous, from 0 to the end; an empty slice or a gap refuses). The
Split takes the Slices' output values over, so names and readers stay. Exact.

    SplitToSequence(x, split, axis) -> s,  SequenceAt(s, i) -> a_i    ->  Split(x, lengths, axis) -> a_0, ...

(older GPT-2 exports split the fused QKV projection so). Preconditions: every reader of the sequence is a
SequenceAt at a distinct constant position; the split is given (a scalar chunk size or constant lengths) or,
without it, keepdims is 1 (chunks of one); the dim is static. Chunks nobody reads become unused outputs. Exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.operands import int_list, slice_arguments
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
        split = split_node(ctx, graph, match.value("x"), lengths, plan.axis, [n.outputs[0] for n in nodes],
                           f"{earliest.name}_split", before=earliest)
        # The other Slices gave their outputs to the Split: they read x and produce nothing anyone reads.
        graph.remove_nodes([n for n in nodes if n is not match.node("slice")])
        return split


def split_node(ctx: PassContext, graph, x: Value, lengths: list[int], axis: int, outputs: list, name: str,
               before: Node) -> Node:
    """Split(x) into ``lengths`` along ``axis``: the lengths an input from opset 13, an attribute before."""
    attributes, inputs = {"axis": axis}, [x]
    if ctx.opset() >= SPLIT_AS_INPUT_SINCE:
        inputs.append(graph.add_initializer(f"{name}_lengths", np.array(lengths, np.int64)))
    else:
        attributes["split"] = lengths
    return graph.add_node("Split", inputs, outputs=outputs, name=name, attributes=attributes, before=before)


@dataclass(frozen=True)
class Chunks:
    axis: int
    lengths: list[int]
    #: chunk index -> the SequenceAt reading it
    readers: dict[int, Node]


def chunk_lengths(node: Node, dim: int) -> list[int] | str:
    """The lengths SplitToSequence cuts a dim of ``dim`` elements into, or why they are not known."""
    if node.input(1) is None:
        if not node.attr("keepdims", 1):
            return "it has no split and keepdims=0, so its chunks lose the axis a Split keeps"
        return [1] * dim
    split = int_list(node.input(1))
    if split is None:
        return "its split is not a constant"
    if node.input(1).rank == 0 or len(split) == 1 and node.input(1).rank != 1:
        size = split[0]
        return [size] * (dim // size) + ([dim % size] if dim % size else []) if size > 0 else "its split is not positive"
    return split if sum(split) == dim and all(n >= 0 for n in split) else f"its split {split} does not add up to {dim}"


class SequenceAtSplit(Rule):
    name = "split_to_sequence_to_split"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.SplitToSequence(p.var("x"), key="split_sequence", out="sequence")
        return p

    def check(self, ctx: PassContext, match: Match) -> Chunks | str | None:
        node, x, sequence = match.node("split_sequence"), match.value("x"), match.value("sequence")
        if x.shape is None or sequence.is_graph_output or not sequence.uses:
            return None
        axis = int(node.attr("axis", 0)) % len(x.shape)
        if not isinstance(x.shape[axis], int):
            return f"{describe(node)} splits a dim of unknown size"
        lengths = chunk_lengths(node, x.shape[axis])
        if isinstance(lengths, str):
            return f"{describe(node)}: {lengths}"
        readers: dict[int, Node] = {}
        for use in sequence.uses:
            position = int_list(use.node.input(1)) if use.node.op_type == "SequenceAt" else None
            if position is None or len(position) != 1 or not -len(lengths) <= position[0] < len(lengths):
                return (f"the sequence {sequence.name!r} is read by {describe(use.node)}, not only by SequenceAt at "
                        f"constant positions")
            index = position[0] % len(lengths)
            if index in readers:
                return f"two SequenceAt read chunk {index} of {sequence.name!r}"
            readers[index] = use.node
        return Chunks(axis, lengths, readers)

    def rewrite(self, ctx: PassContext, match: Match, plan: Chunks) -> Node:
        node, graph = match.node("split_sequence"), match.graph
        outputs = [plan.readers[i].outputs[0] if i in plan.readers else f"{node.name}_unused{i}"
                   for i in range(len(plan.lengths))]
        split = split_node(ctx, graph, match.value("x"), plan.lengths, plan.axis, outputs, f"{node.name}_split",
                           before=node)
        graph.remove_nodes(plan.readers.values())  # their outputs went to the Split
        return split


@register_pass(name="split_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn sibling Slices that tile a tensor along one axis, and SplitToSequence read by "
                           "SequenceAt at constant positions, into one Split")
def split_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [SiblingSlices(), SequenceAtSplit()])
