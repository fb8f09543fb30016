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

    s:[L, N, 3E] -> Reshape [L, N, 3, E] -> Unsqueeze 0 -> Transpose -> Squeeze -> x:[3, L, N, E]
      -> Gather(x, 0) -> q,  Gather(x, 1) -> k,  Gather(x, 2) -> v      ->  Split(s, [E, E, E], axis 2) -> q, k, v

(torch's nn.MultiheadAttention unbinds its packed in-projection so: torchvision's ViT, every model built on
it). Gathers at every constant index of one axis of x, read by nothing else, where x is s seen through
Reshapes, Squeezes, Unsqueezes and Transposes that move no data within a part: each part is a block of
consecutive elements along one axis of s, in s's own order. The view chain is replayed on (size, stride)
pairs of s's layout to prove it; a part whose shape differs from the Gather's output (unit dims) gets a
Reshape. Every shape static. Exact: the same elements, in the same order.
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


#: Ops that only re-view their input (no element moves relative to the others within a part).
VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose")
#: (size, stride) per axis of a value seen as a view of a row-major source.
Layout = list[tuple[int, int]]


def _static(value: Value | None) -> tuple[int, ...] | None:
    shape = value.shape if value is not None else None
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def row_major(shape: tuple[int, ...]) -> Layout:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return list(zip(shape, reversed(strides)))


def reshaped(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    """``layout`` seen with ``shape`` (same element count), or None when that is not a view of it: each run of
    dims merged or cut must be contiguous in the source."""
    source = [(size, stride) for size, stride in layout if size != 1]
    result: Layout = []
    i = j = 0
    while j < len(shape):
        if shape[j] == 1:
            result.append((1, 0))
            j += 1
            continue
        if i >= len(source):
            return None
        group, product_in = [source[i]], source[i][0]
        i += 1
        outputs, product_out = [j], shape[j]
        j += 1
        while product_in != product_out:
            if product_in < product_out:
                if i >= len(source):
                    return None
                group.append(source[i])
                product_in *= source[i][0]
                i += 1
            else:
                if j >= len(shape):
                    return None
                outputs.append(j)
                product_out *= shape[j]
                j += 1
        if any(outer[1] != inner[1] * inner[0] for outer, inner in zip(group, group[1:])):
            return None  # the run is not contiguous in the source
        stride = group[-1][1]
        strides = {}
        for axis in reversed(outputs):
            strides[axis] = (shape[axis], stride if shape[axis] != 1 else 0)
            stride *= shape[axis]
        result += [strides[axis] for axis in outputs]
    return result if i == len(source) else None


def view_source(x: Value) -> tuple[Value, list[Node]] | None:
    """The value ``x`` re-views through a chain of VIEWS nodes, each output read only by the next, with the
    chain from the source down; None when x is no such view."""
    chain: list[Node] = []
    value = x
    while value.producer is not None and value.producer.op_type in VIEWS and value.producer.domain == "":
        node = value.producer
        if value is not x and (len(value.uses) != 1 or value.is_graph_output):
            break
        chain.append(node)
        value = node.input(0)
    return (value, chain[::-1]) if chain else None


def view_layout(source: Value, chain: list[Node]) -> Layout | None:
    """The (size, stride) layout of the chain's last output in the row-major ``source``."""
    shape = _static(source)
    if shape is None:
        return None
    layout = row_major(shape)
    for node in chain:
        out = _static(node.outputs[0])
        if out is None:
            return None
        if node.op_type == "Transpose":
            perm = node.attr("perm", None)
            perm = list(perm) if perm is not None else list(range(len(layout)))[::-1]
            if sorted(perm) != list(range(len(layout))):
                return None
            layout = [layout[axis] for axis in perm]
        else:
            layout = reshaped(layout, out)
            if layout is None:
                return None
        if tuple(size for size, _ in layout) != out:
            return None
    return layout


@dataclass(frozen=True)
class Unbind:
    source: Value
    axis: int  # of the source
    #: The Gathers in the order of the parts they take.
    gathers: list[Node]


def _index(node: Node, dim: int) -> int | None:
    """The Gather's one constant index, made non-negative, or None."""
    index = int_list(node.input(1))
    if index is None or len(index) != 1 or (node.input(1).rank or 0) > 1 or not -dim <= index[0] < dim:
        return None
    return index[0] % dim


class UnbindGathers(Rule):
    name = "gathers_to_split"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Gather(p.var("x"), p.var("index").const(), key="gather", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Unbind | str | None:
        x, first = match.value("x"), match.node("gather")
        shape = _static(x)
        if shape is None or x.is_graph_output:
            return None
        axis = int(first.attr("axis", 0)) % len(shape)
        count = shape[axis]
        readers = list(dict.fromkeys(use.node for use in x.uses))
        if count < 2 or len(readers) != count:
            return None
        parts: dict[int, Node] = {}
        for node in readers:
            index = _index(node, count) if node.op_type == "Gather" and node.domain == "" \
                and node.graph is match.graph and int(node.attr("axis", 0)) % len(shape) == axis else None
            if index is None or index in parts or _static(node.outputs[0]) is None:
                return None
            parts[index] = node
        found = view_source(x)
        if found is None:
            return None
        source, chain = found
        layout = view_layout(source, chain)
        if layout is None:
            return f"{describe(first)} reads {x.name!r}, which moves elements of {source.name!r} within a part"
        axis_of_source = _block_axis(layout, axis, _static(source))
        if axis_of_source is None:
            return (f"the parts {describe(first)} and its siblings take of {x.name!r} are not blocks of "
                    f"consecutive elements along one axis of {source.name!r}")
        return Unbind(source, axis_of_source, [parts[i] for i in range(count)])

    def rewrite(self, ctx: PassContext, match: Match, plan: Unbind) -> Node:
        graph, count = match.graph, len(plan.gathers)
        shape = _static(plan.source)
        part = list(shape)
        part[plan.axis] //= count
        earliest = min(plan.gathers, key=lambda n: n.position)
        wanted = [gather.outputs[0] for gather in plan.gathers]
        outputs = [out if _static(out) == tuple(part) else f"{gather.name}_part"
                   for gather, out in zip(plan.gathers, wanted)]
        split = split_node(ctx, graph, plan.source, [shape[plan.axis] // count] * count, plan.axis, outputs,
                           f"{earliest.name}_split", before=earliest)
        for gather, out, piece_value in zip(plan.gathers, wanted, split.outputs):
            if piece_value is not out:  # a part with another shape than the Gather's output (unit dims)
                piece_value.dtype, piece_value.shape = plan.source.dtype, tuple(part)
                target = graph.add_initializer(f"{gather.name}_shape", np.array(_static(out), np.int64))
                graph.add_node("Reshape", [piece_value, target], outputs=[out], name=f"{gather.name}_reshape",
                               before=earliest)
        # the Gathers gave their outputs away; the view chain above them goes with them (nothing else reads it)
        graph.remove_nodes([n for n in plan.gathers if n is not match.node("gather")])
        return split


def _block_axis(layout: Layout, axis: int, source: tuple[int, ...]) -> int | None:
    """The axis of the row-major ``source`` whose consecutive blocks are the parts taken along ``axis`` of a
    view with ``layout``, or None: the other axes must walk the source in its own order."""
    count, step = layout[axis]
    rest = [entry for i, entry in enumerate(layout) if i != axis and entry[0] != 1]
    axes = row_major(source)
    for b, (size, stride) in enumerate(axes):
        if size % count or step != (size // count) * stride:
            continue
        expected = [(d, s) if i != b else (size // count, stride) for i, (d, s) in enumerate(axes)]
        if [entry for entry in expected if entry[0] != 1] == rest:
            return b
    return None


@register_pass(name="split_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn sibling Slices that tile a tensor along one axis, SplitToSequence read by "
                           "SequenceAt at constant positions, and Gathers unbinding a packed projection into one "
                           "Split")
def split_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [SiblingSlices(), SequenceAtSplit(), UnbindGathers()])
