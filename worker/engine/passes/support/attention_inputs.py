"""The rules of attention_fuse that take what feeds an Attention into the op itself: a key-value cache
(past_key, past_value, present_key, present_value), a boolean mask written as an additive -inf mask, and a
mask that is the causal triangle (is_causal). The pass module documents the forms and their preconditions."""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext
from worker.engine.passes.support.normalization import scalar
from worker.engine.passes.support.operands import int_list
from worker.engine.pattern import Match, Pattern, Rule, describe

BOOL = 9  # TensorProto.BOOL


#: (batch, seq, heads, size) <-> (batch, heads, seq, size): how attention splits heads out and joins them back
HEADS_PERM = [0, 2, 1, 3]


def reshapes_to(reshape: Node, source: tuple, expected: list) -> bool:
    """Whether the Reshape's constant shape gives ``expected``: each entry is the expected dim, a 0 copying the
    source's dim there (without allowzero), or the one -1 (then the product fixes it to the expected dim)."""
    new = int_list(reshape.input(1))
    if new is None or len(new) != len(expected) or new.count(-1) > 1:
        return False
    copies = not reshape.attr("allowzero", 0)
    return all(n == e or n == -1 or (n == 0 and copies and i < len(source) and source[i] == e)
               for i, (n, e) in enumerate(zip(new, expected)))


def splits_heads(reshape: Node, x, y) -> bool:
    """Whether Reshape ``reshape`` turns x (batch, seq, heads * size) into y (batch, seq, heads, size)."""
    if x.shape is None or y.shape is None or len(x.shape) != 3 or len(y.shape) != 4:
        return False
    heads, size = y.shape[2], y.shape[3]
    if not (isinstance(heads, int) and isinstance(size, int) and x.shape[2] == heads * size):
        return False
    return reshapes_to(reshape, tuple(x.shape), [x.shape[0], x.shape[1], heads, size])


def joins_heads(reshape: Node, x, y) -> bool:
    """Whether Reshape ``reshape`` turns x (batch, seq, heads, size) into y (batch, seq, heads * size)."""
    if x.shape is None or y.shape is None or len(x.shape) != 4 or len(y.shape) != 3:
        return False
    heads, size = x.shape[2], x.shape[3]
    if not (isinstance(heads, int) and isinstance(size, int)):
        return False
    return reshapes_to(reshape, tuple(x.shape), [x.shape[0], x.shape[1], heads * size])


def heads_layout(match: Match) -> str | bool:
    """For a match whose Reshapes ``q_reshape``, ``k_reshape``, ``v_reshape`` split q3, k3, v3 into heads and
    whose ``y_reshape`` joins the output back (``out``): why they do not, or whether the join is the plain one
    (``joins_heads``). Any other Reshape of the joined heads (GPT-2's (batch * seq, hidden) for its Gemm) is the
    same Reshape of a 3-D output, both being (batch, seq, heads, size) in row-major order; a 0 in its shape
    would copy another dim from the 3-D output, so none may be there."""
    for w in "qkv":
        reshape = match.node(f"{w}_reshape")
        if not splits_heads(reshape, match.value(f"{w}3"), reshape.outputs[0]):
            return f"{describe(reshape)} does not split (batch, seq, hidden) into heads"
    y_reshape = match.node("y_reshape")
    joined = y_reshape.inputs[0]
    reshaped = joins_heads(y_reshape, joined, match.value("out"))
    shape = int_list(y_reshape.input(1))
    if not reshaped and (shape is None or 0 in shape or joined.shape is None or len(joined.shape) != 4 or
                         not isinstance(joined.shape[2], int) or not isinstance(joined.shape[3], int)):
        return f"{describe(y_reshape)} does not join the heads back into (batch, seq, hidden)"
    return reshaped


def sequence_dim(value) -> int | str | None:
    """The sequence length of an Attention's Q, K or V (4-D: (batch, heads, seq, size), 3-D: (batch, seq,
    hidden))."""
    shape = value.shape
    if shape is None or len(shape) not in (3, 4):
        return None
    return shape[2] if len(shape) == 4 else shape[1]


class PastKeyValues(Rule):
    """Attention(q, Concat(past_k, k, axis=2), Concat(past_v, v, axis=2), mask)
        -> Attention(q, k, v, mask, past_k, past_v) -> (y, present_k, present_v), the Concats' outputs."""

    name = "attention_past_key_values"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        keys = p.Concat(p.var("past_k"), p.var("k"), key="k_concat", out="present_k").keep()
        values = p.Concat(p.var("past_v"), p.var("v"), key="v_concat", out="present_v").keep()
        p.Attention(p.var("q"), keys, values, key="attention", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        attention = match.node("attention")
        if len(attention.inputs) > 4 or attention.attr("is_causal", 0):
            return f"{describe(attention)} already has a cache or causal masking"
        for which in "kv":
            concat, past, new = match.node(f"{which}_concat"), match.value(f"past_{which}"), match.value(which)
            shapes = [past.shape, new.shape]
            if len(concat.inputs) != 2 or None in shapes or any(len(s) != 4 for s in shapes) or \
                    concat.attr("axis") not in (2, -2) or past.dtype != new.dtype:
                return (f"{describe(concat)} does not append 4-D {which} to a cache of its type along the "
                        f"sequence axis")
            if not (past.shape[1] == new.shape[1] and past.shape[3] == new.shape[3] and isinstance(new.shape[1], int)):
                return f"the cache {past.name!r} does not have the heads and head size of {new.name!r}"
            present = match.value(f"present_{which}")
            early = [n for n in present.consumers() if n is not attention and n.position < attention.position]
            if early:
                return f"{describe(early[0])} reads the present {which} {present.name!r} before {describe(attention)}"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        attention = match.node("attention")
        mask = attention.input(3) if len(attention.inputs) > 3 else None
        inputs = [match.value("q"), match.value("k"), match.value("v"), mask, match.value("past_k"),
                  match.value("past_v")]
        outputs = [match.value("y"), match.value("present_k"), match.value("present_v")]
        return match.graph.add_node("Attention", inputs, outputs=outputs, name=attention.name, before=attention,
                                    attributes=dict(attention.attributes))


class BooleanMask(Rule):
    """Attention(q, k, v, Where(b, 0, -inf)) -> Attention(q, k, v, b) (b boolean)."""

    name = "attention_boolean_mask"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        # Every layer reads the one mask: each takes the boolean in turn, and the last leaves the Where unused.
        mask = p.Where(p.var("b"), p.var("zero"), p.var("fill"), key="where").keep()
        p.Attention(None, None, None, mask, key="attention", outputs=0)
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        where, b = match.node("where"), match.value("b")
        zero, fill = scalar(match.value("zero")), scalar(match.value("fill"))
        if b.dtype != BOOL or b.shape is None or len(b.shape) > 4 or zero != 0.0 or fill is None:
            return f"{describe(where)} does not select 0 or a constant fill by a boolean mask of rank 4 at most"
        if fill != -np.inf:
            # Where every key of a row is masked, the fill averages the values; the op's boolean mask gives 0.
            return f"{describe(where)} fills the masked scores with {fill:g}, not -inf"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        attention = match.node("attention")
        attention.set_input(3, match.value("b"))
        return attention


class CausalMask(Rule):
    """Attention(.., C) or Attention(.., And(C, m)), C the constant causal triangle (key j <= query i +
    past length) -> Attention(.., [m], is_causal=1)."""

    pattern_args = ("padded",)

    def __init__(self, padded: bool):
        super().__init__()
        self.padded = padded
        self.name = f"attention_causal_mask{'_and_mask' if padded else ''}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        mask = p.And(p.var("triangle"), p.var("m"), key="and", commutative=True).keep() if self.padded else \
            p.var("triangle")
        p.Attention(None, None, None, mask, key="attention", outputs=0)
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        attention, triangle = match.node("attention"), match.value("triangle")
        data = triangle.constant_value()
        if data is not None and not self.padded and np.issubdtype(data.dtype, np.floating):
            # An additive mask of 0 and the lowest value (or -inf): no row is all masked in a causal triangle, so
            # the masked keys' weights are 0 either way.
            lowest = np.finfo(data.dtype).min
            data = None if not np.all((data == 0) | (data <= lowest)) else data == 0
        if data is None or data.dtype != np.bool_ or data.ndim < 2 or any(d != 1 for d in data.shape[:-2]):
            return (f"the mask {triangle.name!r} of {describe(attention)} is not one constant boolean (or 0 and "
                    f"lowest-value) (query, key) matrix")
        past = attention.input(4) if len(attention.inputs) > 4 else None
        dims = [sequence_dim(attention.input(0)), sequence_dim(attention.input(1)),
                0 if past is None else (past.shape[2] if past.shape and len(past.shape) == 4 else None)]
        if not all(isinstance(d, int) for d in dims):
            return f"{describe(attention)} has sequence lengths that are not static"
        queries, keys, cached = dims
        if attention.attr("is_causal", 0) or data.shape[-2:] != (queries, cached + keys):
            return (f"the mask {triangle.name!r} is not of {describe(attention)}'s {queries} queries by "
                    f"{cached + keys} keys")
        causal = np.arange(cached + keys)[None, :] <= np.arange(queries)[:, None] + cached
        if not np.array_equal(data.reshape(data.shape[-2:]), causal):
            return (f"the mask {triangle.name!r} is not the causal triangle offset by the {cached} cached keys "
                    f"(the op's is_causal)")
        rest = match.value("m").shape if self.padded else None
        if self.padded and (rest is None or not 2 <= len(rest) <= 4 or tuple(rest[-2:]) != (queries, cached + keys)):
            # onnxruntime's kernel reads a mask of rank 2 to 4 with a row per query and a column per key.
            return (f"the mask {match.value('m').name!r} left beside the causal triangle is not {queries} queries by "
                    f"{cached + keys} keys of rank 2 to 4 (onnxruntime broadcasts no mask over the queries)")
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        attention = match.node("attention")
        attention.set_input(3, match.value("m") if self.padded else None)
        attention.set_attr("is_causal", 1)
        return attention


class KeysThroughThreeDims(Rule):
    """Attention(q, Transpose(Reshape(Transpose(Reshape(k, (n, s, d)), (0, 2, 1)), (b, h, d, s)), (0, 1, 3, 2)))
        -> Attention(q, Reshape(k, (b, h, s, d))) (no Reshape when k is that shape): the keys transposed through
        a 3-D view and back (torch's scaled_dot_product_attention decomposed by the dynamo exporter, whose
        first Reshape also joins repeat_kv's heads), where k (..., s, d) has n = b * h leading elements."""

    name = "attention_keys_through_three_dims"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        flat = p.Reshape(p.var("k"), None, key="flatten")
        swapped = p.Transpose(flat, key="swap", attrs={"perm": [0, 2, 1]})
        kt = p.Reshape(swapped, None, key="unflatten")
        keys = p.Transpose(kt, key="transpose", attrs={"perm": [0, 1, 3, 2]})
        p.Attention(None, keys, key="attention", outputs=0)
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple | str:
        k, kt = match.value("k"), match.node("unflatten").outputs[0]
        flat = match.node("flatten").outputs[0]
        shapes = [k.shape, flat.shape, kt.shape]
        if any(s is None or not all(isinstance(d, int) for d in s) for s in shapes) or len(k.shape) < 3 or \
                len(flat.shape) != 3 or len(kt.shape) != 4:
            return (f"{describe(match.node('flatten'))} and {describe(match.node('unflatten'))} do not have static "
                    f"3-D and 4-D shapes")
        b, h, d, s = kt.shape
        if tuple(flat.shape) != (b * h, s, d) or tuple(k.shape[-2:]) != (s, d):
            return f"{describe(match.node('unflatten'))} does not give back the keys {k.name!r} transposed"
        return (b, h, s, d)

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple) -> list[Node]:
        attention, k, graph = match.node("attention"), match.value("k"), match.graph
        if tuple(k.shape) == plan:
            attention.set_input(1, k)
            return [attention]
        shape = graph.add_initializer(f"{attention.name}_keys_shape", np.array(plan, np.int64))
        reshape = graph.add_node("Reshape", [k, shape], outputs=1, name=f"{attention.name}_keys", before=attention)
        keys = reshape.outputs[0]
        keys.dtype, keys.shape = k.dtype, plan
        attention.set_input(1, keys)
        return [reshape, attention]


class ScaledOperand(Rule):
    """A query or key an attention op reads through a Mul by a constant scalar: the scalar goes into the op's
    scale, since (c q) kT = q (c kT) = c (q kT).

        Attention(Mul(q, c), k, v, scale=s)    ->  Attention(q, k, v, scale=s * c)      (the keys likewise)

    torch's scaled_dot_product_attention as TorchScript exports it scales q and kT each by the square root of a
    scale computed from q's shape at run time (timm's PiT, CaFormer): a chain fused in the first round, before
    that computation folds, keeps both Muls outside the op. ``op`` is (domain, op type), ``slot`` the input
    (0 the query, 1 the keys); ``transposed``: the op reads it through a Transpose (the standard op's keys, the
    Transpose attention_fuse puts before them), which then reads ``q`` itself. An op without a scale attribute
    takes 1 / sqrt(head size) (the standard op's default), known from a static query."""

    pattern_args = ("op", "slot", "transposed")

    def __init__(self, op: tuple[str, str], slot: int, transposed: bool = False):
        super().__init__()
        self.op, self.slot, self.transposed = op, slot, transposed
        self.name = f"{op[1]}_scaled_{'query' if slot == 0 else 'keys'}{'_transposed' if transposed else ''}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        scaled = p.Mul(p.var("x"), p.var("c"), key="mul", commutative=True)
        if self.transposed:
            scaled = p.Transpose(scaled, key="transpose")
        inputs = [scaled if i == self.slot else None for i in range(self.slot + 1)]
        p.op(self.op[1], *inputs, key="attention", domain=self.op[0])
        return p

    def check(self, ctx: PassContext, match: Match) -> float | str | None:
        c, attention = scalar(match.value("c")), match.node("attention")
        if c is None or not np.isfinite(c):
            return None  # a Mul by a tensor or by something known only at run time: no scale to take
        if match.value("x").shape is None or match.value("x").shape != match.node("mul").outputs[0].shape:
            return f"{describe(match.node('mul'))} is not known to keep its operand's shape"
        scale = attention.attr("scale")
        if scale is None:
            scale = default_scale(attention)
            if scale is None:
                return f"{describe(attention)} has no scale and its query's head size is not known"
        return float(scale) * c

    def rewrite(self, ctx: PassContext, match: Match, scale: float) -> Node:
        attention = match.node("attention")
        reader = match.node("transpose") if self.transposed else attention
        reader.set_input(0 if self.transposed else self.slot, match.value("x"))
        attention.set_attr("scale", scale)
        return attention


def default_scale(attention: Node) -> float | None:
    """The standard Attention's scale without the attribute: 1 / sqrt(head size), from a static query."""
    shape = attention.input(0).shape
    if shape is None or not isinstance(shape[-1], int):
        return None
    if len(shape) == 4:
        return 1.0 / float(np.sqrt(shape[-1]))
    heads = attention.attr("q_num_heads")
    if len(shape) == 3 and heads and shape[-1] % heads == 0:
        return 1.0 / float(np.sqrt(shape[-1] // heads))
    return None
