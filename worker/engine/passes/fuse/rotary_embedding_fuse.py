"""rotary_embedding_fuse: rotary position embedding written out with halves, a negation and a concat becomes
the RotaryEmbedding op (opset 23+).

    a, b = Split(x, [d/2, d/2], axis=-1)
    y = x * cos + Concat(-b, a, axis=-1) * sin                  ->  RotaryEmbedding(x, cos_cache, sin_cache)

    r, rest = Split(x, [rot, d - rot], axis=-1)                 (partial rotary: GPT-NeoX, Phi)
    y = Concat(rotary(r), rest, axis=-1)                        ->  RotaryEmbedding(x, ..., rotary_embedding_dim=rot)

x is (batch, heads, seq, head) (the transformers library's rotate-half, after split_fuse turned its two
Slices into a Split). Constant cos and sin (static-shape exports fold them) must broadcast to x, not vary
along the heads, and repeat their first half in the second (cos = cat(freqs, freqs).cos(): the op takes each
frequency once); the caches become (batch, seq, rot/2), so batch and seq must be static. Cos and sin computed
at run time (dynamic batch or sequence) are taken when their structure proves the same:

    cos = Unsqueeze(Cast(Cos(Concat(f, f, axis=-1)) * s), axis 1)   ->  cos_cache = Cast(Cos(f) * s)

(scale and Cast optional; f is (batch or 1, seq, rot/2) with x's seq: the same dim after type inference, or
positions Range(0, that dim, 1) times the inverse frequencies; a batch of 1 is expanded to x's, as the op wants
(batch, seq, rot/2) caches). The cache is built once per f and shared by every layer. Refused
before opset 23 (``--target-opset 23`` raises it), where no valid place has a RotaryEmbedding kernel, and
when any of the above does not hold, each with a sentence. The interleaved form (GPT-J's rotate_every_two:
even and odd elements by step-2 Slices, the negated odd ones and the even ones stacked on a new last axis and
flattened back) becomes the op with interleaved=1, its cos and sin repeating each value in its odd neighbour.
GPT-J's own layout, x (batch, seq, heads, head) with cos and sin gathered at the positions from a constant
table and repeat_interleave'd at run time, becomes the op on x's 3-D form (num_heads, position_ids, the
table's columns as caches); the gather's chain is proved position by position by running it on the table. Numeric effect: the op computes cos * x1 - sin * x2 and sin * x1 + cos * x2 in one kernel; the same
products and sums as the chain, so results agree to the last bits.
"""
from __future__ import annotations

import numpy as np

from typing import NamedTuple

from worker.engine.evaluate import evaluate
from worker.engine.ir import Graph, Node, Value
from worker.engine.limits import elements_from_values
from worker.engine.passes.base import Analysis, PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.operands import axes_of, int_list, ints_input_or_attr, slice_arguments
from worker.engine.passes.support.shapes import same_dim, same_shape
from worker.engine.passes.support.standard_ops import standard_op_refusal
from worker.engine.passes.support.weights import FLOAT_TYPES, numpy_dtype
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

#: Opset from which Split takes ``split`` as an input instead of an attribute.
SPLIT_AS_INPUT_SINCE = 13


def split_lengths(node: Node, dim: int, opset: int) -> list[int] | None:
    """The lengths the two-output Split ``node`` cuts a dim of ``dim`` elements into, or None."""
    lengths = ints_input_or_attr(node, 1, "split", opset, SPLIT_AS_INPUT_SINCE)
    if lengths is None:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            return None  # lengths computed at run time
        lengths = [-(-dim // 2), dim - -(-dim // 2)]  # no split: equal parts, the last one smaller
    return list(lengths) if len(lengths) == 2 and sum(lengths) == dim else None


def last_axis(node: Node, rank: int) -> bool:
    axis = node.attr("axis", 0)
    return axis is not None and axis % rank == rank - 1


def cache(factor: np.ndarray, shape: tuple[int, ...], rot: int, interleaved: bool = False) -> np.ndarray | None:
    """The (batch, seq, rot/2) cache of a cos or sin factor that broadcasts to x's rotated part ``shape``
    (batch, heads, seq, rot), is the same for every head and repeats its first half (``interleaved``: each
    even element in the odd one after it); else None."""
    if factor.ndim > 4:
        return None
    factor = factor.reshape((1,) * (4 - factor.ndim) + factor.shape)
    try:
        np.broadcast_shapes(factor.shape, shape)
    except ValueError:
        return None
    if factor.shape[3] != rot or np.broadcast_shapes(factor.shape, shape) != tuple(shape):
        return None
    if factor.shape[1] != 1 and not (factor == factor[:, :1]).all():
        return None
    half = rot // 2
    if interleaved:
        first, second = factor[:, 0, :, 0::2], factor[:, 0, :, 1::2]
    else:
        first, second = factor[:, 0, :, :half], factor[:, 0, :, half:]
    if not np.array_equal(first, second):
        return None
    return np.ascontiguousarray(np.broadcast_to(first, (shape[0], shape[2], half)))


class RuntimeFactor(NamedTuple):
    """A run-time cos or sin factor proved to be Unsqueeze(Cast(op(Concat(f, f)) * scale), heads axis) (or
    without the Unsqueeze when the batch is 1: a leading 1 broadcasts the same)."""
    op: str
    frequencies: Value
    scale: np.ndarray | None
    cast_to: int | None
    expand: bool  # f has batch 1 and x's batch is not known to be 1


def runtime_factor(factor: Value, op: str, x: Value, rot: int, opset: int) -> RuntimeFactor | str:
    """Walk up from the factor a Mul reads to the frequencies f, or say which step is not the rotary form."""
    node, value = factor.producer, factor
    if node is not None and node.op_type == "Unsqueeze" and node.input(0).rank == 3 and \
            [a % 4 for a in axes_of(node, opset) or []] == [1]:
        value = node.input(0)
    elif factor.rank != 3 or factor.shape[0] != 1:  # (1, seq, rot) broadcasts as (1, 1, seq, rot)
        return "is not a (batch, seq, rot) table unsqueezed on the heads axis"
    cast_to, scale = None, None
    node = value.producer
    if node is not None and node.op_type == "Cast":
        cast_to, value = node.attr("to"), node.input(0)
        node = value.producer
    if node is not None and node.op_type == "Mul":
        constants = [slot for slot in (0, 1) if node.input(slot).constant_value() is not None]
        if not constants or node.input(constants[0]).constant_value().size != 1:
            return "is scaled by something other than a constant scalar"
        scale = node.input(constants[0]).constant_value().reshape(())
        value = node.input(1 - constants[0])
        node = value.producer
    if node is None or node.op_type != op:
        return f"is not computed by {op}"
    joined = node.input(0).producer
    if joined is None or joined.op_type != "Concat" or len(joined.inputs) != 2 or \
            joined.input(0) is not joined.input(1) or joined.attr("axis", 0) % 3 != 2:
        return f"is not {op} of one table concatenated with itself on the last axis"
    frequencies = joined.input(0)
    shape = frequencies.shape
    if shape is None or len(shape) != 3 or shape[2] != rot // 2 or \
            not (same_dim(shape[1], x.shape[2]) or same_dim(positions_count(frequencies, rot), x.shape[2])):
        return (f"does not take {op} of a (batch, seq, {rot // 2}) table with the sequence of {x.name!r} "
                f"([{', '.join(map(str, shape or ()))}] against [{', '.join(map(str, x.shape))}])")
    if (cast_to or frequencies.dtype) != x.dtype:
        return f"does not have the type of {x.name!r}"
    if not same_dim(shape[0], x.shape[0]) and shape[0] != 1:
        return f"has a batch that is neither 1 nor the batch of {x.name!r}"
    return RuntimeFactor(op, frequencies, scale, cast_to, not same_dim(shape[0], x.shape[0]))


def strip(value: Value, ops: tuple[str, ...]) -> Value:
    while value.producer is not None and value.producer.op_type in ops:
        value = value.producer.input(0)
    return value


def positions_count(frequencies: Value, rot: int) -> object:
    """The sequence dim f's positions count, when f (1, n, rot/2) is positions (1, n, 1) * inv_freq (rot/2) and
    the positions are Range(0, dim d of some value, 1): that value's dim d. Type inference may give the Range
    a fresh symbol; this is the structural proof that n is that dim. None when not of this form."""
    node = frequencies.producer
    if frequencies.shape[0] != 1 or node is None or node.op_type != "Mul":
        return None
    constants = [slot for slot in (0, 1) if node.input(slot).constant_value() is not None]
    positions = node.input(1 - constants[0]) if len(constants) == 1 else None
    if positions is None or node.input(constants[0]).shape[-1:] != (rot // 2,) or \
            np.prod(node.input(constants[0]).shape) != rot // 2 or positions.shape is None or \
            tuple(positions.shape)[-1:] != (1,):
        return None
    return range_count(positions)


def range_count(positions: Value) -> object:
    """The dim the positions count, when they are Range(0, dim d of some value, 1) (cast or unsqueezed): that
    value's dim d; else None."""
    ranged = strip(positions, ("Cast", "Unsqueeze")).producer
    if ranged is None or ranged.op_type != "Range" or int_list(ranged.input(0)) != [0] or \
            int_list(ranged.input(2)) != [1]:
        return None
    limit = strip(ranged.input(1), ("Cast", "Squeeze", "Reshape")).producer
    if limit is not None and limit.op_type == "Gather" and limit.input(0).producer is not None and \
            limit.input(0).producer.op_type == "Shape" and not limit.input(0).producer.attributes:
        index, source = int_list(limit.input(1)), limit.input(0).producer.input(0)
    elif limit is not None and limit.op_type == "Shape" and limit.attr("end") is not None and \
            limit.attr("end") == limit.attr("start", 0) + 1:
        index, source = [limit.attr("start", 0)], limit.input(0)
    else:
        return None
    if index is None or len(index) != 1 or source.shape is None or not -len(source.shape) <= index[0] < len(source.shape):
        return None
    return source.shape[index[0]]


def typed(node: Node, dtype: int, shape: tuple) -> Value:
    node.outputs[0].dtype, node.outputs[0].shape = dtype, tuple(shape)
    return node.outputs[0]


class Caches:
    """The run-time caches built so far in one run of a rule: one per table, shared by every layer. Built
    before the rule's first rewrite, which comes first in graph order, so they precede every later one."""

    def __init__(self):
        self.built: dict[tuple, Value] = {}

    def get(self, graph: Graph, factor: RuntimeFactor, x: Value, before: Node) -> Value:
        f = factor.frequencies
        if factor.expand:
            key = ("expand", f)
            if key not in self.built:
                batch = typed(graph.add_node("Shape", [x], name=f"{f.name}_batch", before=before,
                                             attributes={"end": 1}), 7, (1,))
                rest = typed(graph.add_node("Shape", [f], name=f"{f.name}_rest", before=before,
                                            attributes={"start": 1}), 7, (2,))
                shape = typed(graph.add_node("Concat", [batch, rest], name=f"{f.name}_shape", before=before,
                                             attributes={"axis": 0}), 7, (3,))
                self.built[key] = typed(graph.add_node("Expand", [f, shape], name=f"{f.name}_expand",
                                                       before=before), f.dtype, (x.shape[0], *f.shape[1:]))
            f = self.built[key]
        key = (factor.op, f, None if factor.scale is None else factor.scale.tobytes(), factor.cast_to)
        if key not in self.built:
            value = typed(graph.add_node(factor.op, [f], name=f"{f.name}_{factor.op.lower()}", before=before),
                          f.dtype, f.shape)
            if factor.scale is not None:
                scale = graph.add_initializer(f"{value.name}_scale", factor.scale.astype(numpy_dtype(f.dtype)))
                value = typed(graph.add_node("Mul", [value, scale], name=f"{value.name}_scaled", before=before),
                              f.dtype, f.shape)
            if factor.cast_to is not None:
                value = typed(graph.add_node("Cast", [value], name=f"{value.name}_cast", before=before,
                                             attributes={"to": factor.cast_to}), factor.cast_to, f.shape)
            self.built[key] = value
        return self.built[key]


class RotateHalf(Rule):
    pattern_args = ("partial",)

    def __init__(self, partial: bool):
        super().__init__()
        self.partial = partial
        self.name = "rotary_rotate_half_partial" if partial else "rotary_rotate_half"
        self.caches = Caches()

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x = p.var("x")
        if self.partial:
            rotated, rest = p.Split(x, None, outputs=2, key="outer_split")
        else:
            rotated = x
        first, second = p.Split(rotated, None, outputs=2, key="split")
        swapped = p.Concat(p.Neg(second, key="neg"), first, key="concat")
        with_cos = p.Mul(rotated, p.var("cos"), key="mul_cos", commutative=True)
        with_sin = p.Mul(swapped, p.var("sin"), key="mul_sin", commutative=True)
        last = None if self.partial else "out"
        rotary = p.Add(with_cos, with_sin, key="add", commutative=True, out=last)
        if self.partial:
            p.Concat(rotary, rest, key="join", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple | str:
        """(rotary dim, cos cache, sin cache) (each constant or a RuntimeFactor), or why the chain is not a
        RotaryEmbedding."""
        refusal = standard_op_refusal(ctx, "RotaryEmbedding", 23)
        if refusal:
            return refusal
        x, split = match.value("x"), match.node("split")
        shape = x.shape
        if x.dtype not in FLOAT_TYPES or shape is None or len(shape) != 4 or not isinstance(shape[3], int):
            return (f"the input {x.name!r} of the rotary chain at {describe(split)} is not a float tensor "
                    f"(batch, heads, seq, head) of a static head size")
        head, opset = shape[3], ctx.opset()
        rot = head
        if self.partial:
            outer = split_lengths(match.node("outer_split"), head, opset)
            if outer is None or not last_axis(match.node("outer_split"), 4) or not last_axis(match.node("join"), 4):
                return (f"{describe(match.node('outer_split'))} and {describe(match.node('join'))} do not cut off "
                        f"and put back the rotated head dims")
            rot = outer[0]
        halves = split_lengths(split, rot, opset)
        if halves is None or halves[0] != halves[1] or not last_axis(split, 4):
            return f"{describe(split)} does not cut the rotated head dims of {x.name!r} in two halves"
        if not last_axis(match.node("concat"), 4):
            return f"{describe(match.node('concat'))} does not join along the head dims"
        rotated_shape = (*shape[:3], rot)
        caches = []
        for key in ("cos", "sin"):
            factor = match.value(key).constant_value()
            if factor is None:
                found = runtime_factor(match.value(key), key.capitalize(), x, rot, opset)
                if isinstance(found, str):
                    return f"the {key} factor {match.value(key).name!r} is not a constant and {found}"
                caches.append(found)
                continue
            if not all(isinstance(d, int) for d in shape):
                return (f"the {key} factor {match.value(key).name!r} is a constant but {x.name!r} has no static "
                        f"shape to build the caches for")
            found = cache(factor, rotated_shape, rot)
            if found is None:
                return (f"the {key} factor {match.value(key).name!r} does not broadcast to {list(rotated_shape)} "
                        f"the same for every head with its first half repeated in its second")
            caches.append(found.astype(numpy_dtype(x.dtype)))
        return rot, caches[0], caches[1]

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple) -> Node:
        rot, *factors = plan
        graph, anchor = match.graph, match.node("add")
        last = match.node("join") if self.partial else anchor
        inputs = [match.value("x")]
        for key, factor in zip(("cos", "sin"), factors):
            inputs.append(self.caches.get(graph, factor, match.value("x"), last) if isinstance(factor, RuntimeFactor)
                          else graph.add_initializer(f"{anchor.name}_{key}_cache", factor))
        attributes = {"rotary_embedding_dim": rot} if self.partial else {}
        return graph.add_node("RotaryEmbedding", inputs, outputs=[match.value("out")], name=anchor.name,
                              before=last, attributes=attributes)


def every_other(node: Node, start: int, dim: int, opset: int) -> bool:
    """Whether the Slice ``node`` takes the elements start, start + 2, ... of the last of 4 axes (dim ``dim``)."""
    arguments = slice_arguments(node, opset)
    if isinstance(arguments, str):
        return False
    starts, ends, axes, steps = arguments
    return len(starts) == 1 and starts[0] == start and ends[0] >= dim and (axes or [0])[0] % 4 == 3 \
        and (steps or [1])[0] == 2


def every_two(p: Pattern, x, out: str | None = None):
    """The pattern of rotate_every_two applied to ``x``: x * cos + Reshape(Concat(Unsqueeze(-x[1::2]),
    Unsqueeze(x[0::2]), axis=-1)) * sin (keys even, odd, neg, unsqueeze_odd, unsqueeze_even, concat, flatten,
    mul_cos, mul_sin, add; variables cos and sin)."""
    even = p.Slice(x, None, None, None, None, key="even")
    odd = p.Slice(x, None, None, None, None, key="odd")
    pairs = p.Concat(p.Unsqueeze(p.Neg(odd, key="neg"), None, key="unsqueeze_odd"),
                     p.Unsqueeze(even, None, key="unsqueeze_even"), key="concat")
    swapped = p.Reshape(pairs, None, key="flatten")
    with_cos = p.Mul(x, p.var("cos"), key="mul_cos", commutative=True)
    with_sin = p.Mul(swapped, p.var("sin"), key="mul_sin", commutative=True)
    return p.Add(with_cos, with_sin, key="add", commutative=True, out=out)


class RotateEveryTwo(Rule):
    """The interleaved form (GPT-J's rotate_every_two): pairs (x[2i], x[2i+1]) rotate together.

        a = x[..., 0::2], b = x[..., 1::2]
        y = x * cos + Reshape(Concat(Unsqueeze(-b, -1), Unsqueeze(a, -1), axis=-1), x.shape) * sin
                                                 ->  RotaryEmbedding(x, cos_cache, sin_cache, interleaved=1)

    cos and sin repeat each frequency in two neighbours (repeat_interleave); the caches take the even ones."""

    name = "rotary_rotate_every_two"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        every_two(p, p.var("x"), out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple[int, np.ndarray, np.ndarray] | str:
        refusal = standard_op_refusal(ctx, "RotaryEmbedding", 23)
        if refusal:
            return refusal
        x, opset = match.value("x"), ctx.opset()
        shape = x.shape
        if x.dtype not in FLOAT_TYPES or shape is None or len(shape) != 4 or \
                not all(isinstance(d, int) for d in shape) or shape[3] % 2:
            return (f"the input {x.name!r} of the rotary chain at {describe(match.node('concat'))} is not a float "
                    f"tensor of static shape (batch, heads, seq, head) with an even head size")
        head = shape[3]
        if not every_other(match.node("even"), 0, head, opset) or not every_other(match.node("odd"), 1, head, opset):
            return (f"{describe(match.node('even'))} and {describe(match.node('odd'))} do not take the even and odd "
                    f"head dims of {x.name!r}")
        for key in ("unsqueeze_odd", "unsqueeze_even"):
            node = match.node(key)
            axes = int_list(node.input(1)) if len(node.inputs) > 1 else node.attr("axes")
            if list(axes or []) not in ([-1], [4]):
                return f"{describe(node)} does not add a last axis"
        if match.node("concat").attr("axis", 0) % 5 != 4 or match.node("flatten").outputs[0].shape != shape:
            return (f"{describe(match.node('concat'))} and {describe(match.node('flatten'))} do not interleave the "
                    f"pairs back into {list(shape)}")
        caches = []
        for key in ("cos", "sin"):
            factor = match.value(key).constant_value()
            if factor is None:
                return f"the {key} factor {match.value(key).name!r} is not a constant"
            found = cache(factor, tuple(shape), head, interleaved=True)
            if found is None:
                return (f"the {key} factor {match.value(key).name!r} does not broadcast to {list(shape)} the same "
                        f"for every head with each value repeated in its odd neighbour")
            caches.append(found.astype(numpy_dtype(x.dtype)))
        return head, caches[0], caches[1]

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple[int, np.ndarray, np.ndarray]) -> Node:
        _, cos, sin = plan
        graph, anchor = match.graph, match.node("add")
        inputs = [match.value("x"), graph.add_initializer(f"{anchor.name}_cos_cache", cos),
                  graph.add_initializer(f"{anchor.name}_sin_cache", sin)]
        return graph.add_node("RotaryEmbedding", inputs, outputs=[match.value("out")], name=anchor.name,
                              before=anchor, attributes={"interleaved": 1})


#: Ops a gathered factor may pass through between the table lookup and the Mul: data movement that acts on
#: each position alone (checked numerically as well, ``gathered_factor``).
MOVES = frozenset({"Split", "Slice", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Tile", "Identity"})
#: Largest table the proof runs the chain on (GPT-J's is 2048 x 64).
MAX_TABLE = 1 << 22


class GatheredFactor(NamedTuple):
    """A run-time cos or sin factor proved to be a constant table's rows at the positions, each value repeated in
    its odd neighbour and broadcast over the heads: RotaryEmbedding's cache with position_ids."""
    cache: np.ndarray  # (positions, rot/2)
    positions: Value  # (1 or batch, seq) int64, or (.., seq, 1) for GatherND


def gathered_factor(factor: Value, x: Value, rot: int, opset: int) -> GatheredFactor | str:
    """Walk up from the factor to Gather(table, positions) through position-wise data movement, then run that
    chain on every position the table holds (and on a shuffled part of them) to read the cache off it."""
    chain, value = [], factor
    while value.producer is not None and value.producer.op_type in MOVES:
        node = value.producer
        if any(v is not None and v is not node.input(0) and v.constant_value() is None for v in node.inputs):
            return f"moves through {describe(node)}, which reads a value computed at run time"
        chain.append(node)
        value = node.input(0)
    lookup = value.producer
    if lookup is None or lookup.op_type not in ("Gather", "GatherND") or lookup.attr("axis", 0) != 0 or \
            lookup.attr("batch_dims", 0) != 0:
        return "is neither a constant nor rows of a constant table gathered at the positions"
    table, positions = lookup.input(0).constant_value(), lookup.input(1)
    if table is None or table.ndim != 2 or positions.dtype != 7 or positions.shape is None:
        return f"is gathered by {describe(lookup)} from something other than a constant 2-D table at int64 positions"
    nd = lookup.op_type == "GatherND"
    if nd and (len(positions.shape) != 3 or positions.shape[2] != 1) or not nd and len(positions.shape) != 2:
        return f"is gathered by {describe(lookup)} at positions that are not (batch, seq{', 1' if nd else ''})"
    if not same_dim(positions.shape[1], x.shape[1]) and not same_dim(range_count(positions), x.shape[1]):
        return f"is gathered at positions that do not count the sequence of {x.name!r}"

    if table.size > MAX_TABLE:
        return f"is gathered from a table of {table.size} values, more than the {MAX_TABLE} this proof runs on"

    def run(rows: np.ndarray) -> np.ndarray | None:
        data = table[rows][None]  # (1, n, columns): the lookup at positions (1, n)
        for node in reversed(chain):
            if node.op_type in ("Expand", "Tile") and \
                    not 0 < (elements_from_values(node.op_type, data.shape, [data, node.input(1).constant_value()])
                             or 0) <= 4 * table.size:
                return None  # a factor is the table's rows spread over the pairs: never more than twice them
            found = evaluate(node, [data, *[v.constant_value() if v is not None else None
                                            for v in node.inputs[1:]]], opset)
            if found is None:
                return None
            data = found[node.outputs.index(value_after(node, chain, factor))]
        return data

    count = table.shape[0]
    every, some = run(np.arange(count)), run(np.arange(count)[::-2].copy())
    if every is None or some is None or every.shape != (1, count, 1, rot):
        return f"does not move the table's rows to (1, seq, 1, {rot}) the same at every position"
    if not np.array_equal(some, every[:, ::-2]) or not np.array_equal(every[..., 0::2], every[..., 1::2]):
        return "does not take each position's row alone with each value repeated in its odd neighbour"
    if every.dtype != numpy_dtype(x.dtype):
        return f"does not have the type of {x.name!r}"
    return GatheredFactor(np.ascontiguousarray(every[0, :, 0, 0::2]), positions)


def value_after(node: Node, chain: list[Node], factor: Value) -> Value:
    """The output of ``node`` that the next node of the chain (toward the factor) reads."""
    index = chain.index(node)
    return factor if index == 0 else chain[index - 1].input(0)


class RotateEveryTwoGathered(Rule):
    """GPT-J's rotate_every_two on (batch, seq, heads, head) with cos and sin gathered at the positions from a
    table (``embed_positions``) and repeat_interleave'd: the rotated part is the first ``rot`` head dims.

        r, rest = Split(x, [rot, head - rot], axis=-1)
        y = Concat(r * cos + Reshape(Concat(Unsqueeze(-r[1::2]), Unsqueeze(r[0::2]))) * sin, rest, axis=-1)
            ->  Reshape(RotaryEmbedding(Reshape(x, (batch, seq, heads * head)), cos_cache, sin_cache,
                                        position_ids, interleaved=1, num_heads=heads, rotary_embedding_dim=rot))

    The op takes 3-D input (its 4-D form is heads before seq); the caches are the table's columns, each once,
    and the positions are expanded to x's batch."""

    name = "rotary_rotate_every_two_gathered"

    def __init__(self):
        super().__init__()
        self.built: dict[tuple, Value] = {}

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x = p.var("x")
        rotated, rest = p.Split(x, None, outputs=2, key="outer_split")
        p.Concat(every_two(p, rotated), rest, key="join", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple | str:
        refusal = standard_op_refusal(ctx, "RotaryEmbedding", 23)
        if refusal:
            return refusal
        x, opset, outer = match.value("x"), ctx.opset(), match.node("outer_split")
        shape = x.shape
        if x.dtype not in FLOAT_TYPES or shape is None or len(shape) != 4 or \
                not all(isinstance(d, int) for d in shape[2:]):
            return (f"the input {x.name!r} of the rotary chain at {describe(match.node('concat'))} is not a float "
                    f"tensor (batch, seq, heads, head) of static heads and head size")
        heads, head = shape[2], shape[3]
        lengths = split_lengths(outer, head, opset)
        if lengths is None or not last_axis(outer, 4) or not last_axis(match.node("join"), 4) or lengths[0] % 2:
            return f"{describe(outer)} and {describe(match.node('join'))} do not cut off and put back an even part"
        rot = lengths[0]
        if not every_other(match.node("even"), 0, rot, opset) or not every_other(match.node("odd"), 1, rot, opset):
            return (f"{describe(match.node('even'))} and {describe(match.node('odd'))} do not take the even and odd "
                    f"rotated dims")
        for key in ("unsqueeze_odd", "unsqueeze_even"):
            if list(axes_of(match.node(key), opset) or []) not in ([-1], [4]):
                return f"{describe(match.node(key))} does not add a last axis"
        rotated = match.node("outer_split").outputs[0]
        if match.node("concat").attr("axis", 0) % 5 != 4 or \
                not same_shape(match.node("flatten").outputs[0].shape, rotated.shape):
            return f"{describe(match.node('flatten'))} does not interleave the pairs back into the rotated part"
        factors = []
        for key in ("cos", "sin"):
            found = gathered_factor(match.value(key), x, rot, opset)
            if isinstance(found, str):
                return f"the {key} factor {match.value(key).name!r} {found}"
            factors.append(found)
        if factors[0].positions is not factors[1].positions:
            return "cos and sin are gathered at different positions"
        return heads, head, rot, factors[0], factors[1]

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple) -> list[Node]:
        heads, head, rot, cos, sin = plan
        graph, join, x = match.graph, match.node("join"), match.value("x")
        made = []

        def add(op, inputs, name, shape, dtype=x.dtype, **attributes):
            node = graph.add_node(op, inputs, name=f"{join.name}_{name}", before=join, attributes=attributes)
            made.append(node)
            return typed(node, dtype, shape)

        flat = add("Reshape", [x, graph.add_initializer(f"{join.name}_flat", np.array([0, 0, -1], np.int64))],
                   "flat", (*x.shape[:2], heads * head))
        caches = [graph.add_initializer(f"{join.name}_{key}_cache", factor.cache)
                  for key, factor in (("cos", cos), ("sin", sin))]
        rotated = add("RotaryEmbedding", [flat, *caches, self._positions(graph, cos.positions, x, join, made)],
                      "rotary", (*x.shape[:2], heads * head), interleaved=1, num_heads=heads,
                      rotary_embedding_dim=rot)
        node = graph.add_node("Reshape", [rotated, graph.add_initializer(
            f"{join.name}_heads", np.array([0, 0, heads, head], np.int64))], outputs=[match.value("out")],
            name=join.name, before=join)
        return [*made, node]

    def _positions(self, graph: Graph, positions: Value, x: Value, before: Node, made: list) -> Value:
        """The positions as (batch, seq): a GatherND's last axis dropped, a batch of 1 expanded to x's (built
        once, before the first rewrite, which comes first in graph order)."""
        key = (positions, x.shape[0])
        if key not in self.built:
            value = positions
            if len(positions.shape) == 3:
                node = graph.add_node("Squeeze", [value, graph.add_initializer(
                    f"{positions.name}_last", np.array([2], np.int64))], name=f"{positions.name}_2d", before=before)
                made.append(node)
                value = typed(node, 7, positions.shape[:2])
            if not same_dim(value.shape[0], x.shape[0]):
                shape = graph.add_node("Shape", [x], name=f"{positions.name}_batch_seq", before=before,
                                       attributes={"end": 2})
                expand = graph.add_node("Expand", [value, typed(shape, 7, (2,))], name=f"{positions.name}_batch",
                                        before=before)
                made.extend([shape, expand])
                value = typed(expand, 7, (x.shape[0], value.shape[1]))
            self.built[key] = value
        return self.built[key]


# The op's output is typed as the chain's result was, whose dims onnx may have left unnamed (a run-time cos
# broadcast against the batch): types are inferred again after a rewrite, naming them as X's.
@register_pass(name="rotary_embedding_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               invalidates=(Analysis.TYPES, Analysis.ORDER),
               description="turn rotary embedding written out as halves, Neg, Concat, Mul and Add into "
                           "RotaryEmbedding (opset 23+)")
def rotary_embedding_fuse(ctx: PassContext) -> PassResult:
    # Partial first, so its Concat goes into the op rather than staying behind it.
    return apply_rules(ctx, [RotateHalf(partial=True), RotateHalf(partial=False), RotateEveryTwo(),
                             RotateEveryTwoGathered()])
