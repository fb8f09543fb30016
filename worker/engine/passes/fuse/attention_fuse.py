"""attention_fuse: scaled dot-product attention written out as MatMul/Softmax/MatMul becomes the Attention op
(opset 23+), and grouped-query attention's repeat_kv goes into the op.

    s = MatMul(q [* cq], kT [* c]) [* c | / c] [+ mask [+ mask2]]
    y = MatMul(Softmax(s, axis=-1) [NaN -> 0], v)
                                              ->  Attention(q, Transpose(kT, [0, 1, 3, 2]), v, mask, scale=c)

q (batch, q_heads, seq, head), kT (batch, kv_heads, head, kv_seq) and v (batch, kv_heads, kv_seq, v_head) are
4-D with static head counts and head sizes and equal batches (batch and sequence may be symbolic), and q_heads
a multiple of kv_heads (the op repeats each KV head for q_heads / kv_heads consecutive query heads, as the
transformers library's repeat_kv does). The key transpose the op needs is emitted as a Transpose of kT;
consecutive-transpose fusion then cancels it against the Transpose that made kT (BERT's (0, 2, 3, 1), Llama's
(0, 1, 3, 2)). The scale is a scalar constant (1 without one: BERT's dynamo export folds it into the query
weights); two added masks (T5's position bias and its padding mask) become one Add feeding attn_mask (the
later rules read booleans and the causal triangle out of it). A half-precision model that casts the scores
to float for the Softmax and back (bench/make_llama.py) gets softmax_precision=1 (float), which is what the op
means by it. torch's scaled_dot_product_attention as the exporters decompose it scales q and kT each by a
constant (their product is the scale) and guards the weights with Where(IsNaN(w), 0, w), which zeroes a row whose keys are all masked:
the op's own result there (the spec's errata), so the guard goes in with the chain.

    ... [+ mask] -> Where(b, fill, s) | Where(b, s, fill) -> Softmax ...
                                              ->  Attention(.., [mask +] Where(b, fill, 0) | Where(b, 0, fill))

Eager attention that masks by choosing (torch's masked_fill in XLM and MPT; GPT-2's eager causal Where): the
choice is the scores plus a mask wherever the fill absorbs any score added to it (s + fill == fill): -inf,
or in float32 / float64 a fill at most -2**120 (the lowest float, as the transformers library writes it),
whose half ulp no score reaches; a row masked throughout gets the same weights too. Refused for other fills
(-1e9, -10000, any finite fill in float16), each with a sentence.

    Attention(q, Transpose(Reshape(Transpose(Reshape(k, (n, s, d)), (0, 2, 1)), (b, h, d, s)), (0, 1, 3, 2)))
                                              ->  Attention(q, Reshape(k, (b, h, s, d)))     (no Reshape if k is)

The dynamo exporter's keys, transposed through a 3-D view (whose first Reshape also joins repeat_kv's heads):
static shapes, n = b * h, k ending in (s, d).

    Attention(q, Concat(past_k, k, axis=2), Concat(past_v, v, axis=2), mask)
                                              ->  Attention(q, k, v, mask, past_k, past_v) -> y, present_k, present_v

A decoder's KV cache: the Concats' outputs become the op's present_key / present_value (the graph's present
outputs keep their names). Preconditions: both Concats join two 4-D tensors of one type along the sequence
axis with equal heads and head sizes; the op has no cache and is_causal 0 yet (the op's causal triangle is
offset by the cached keys, so a triangle read as is_causal without a cache must keep the Concats); no node
reads the present key or value before the op.

    Attention(.., Where(b, 0, -inf))          ->  Attention(.., b)              (b boolean)

A boolean mask the chain adds as 0 / -inf. Refused for a finite fill (the transformers library's eager masks
and the dynamo exporter's sdpa fill with the lowest float): where every key of a row is masked the chain
averages the values there and the op's boolean mask gives 0.

    Attention(.., C) | Attention(.., And(C, m))   ->  Attention(.., [m], is_causal=1)

C, a constant (query, key) matrix (boolean, or additive 0 / lowest value or -inf when it is the whole mask),
is exactly the op's causal triangle: key j allowed iff j <= i + the past_key's length (bottom-right, as the
opset 23 spec's errata and onnxruntime 1.31 define it). Preconditions: static sequence lengths; C's leading
dims 1; m (the padding mask) has a row per query and a column per key, rank 2 to 4, since onnxruntime's kernel
broadcasts no mask over the queries (a padding mask (b, 1, 1, keys) keeps the And).

    Attention(q, Reshape(Expand(Unsqueeze(k, [2]), [b, kv, n, s, d]), [b, kv * n, s, d]), ...)
                                              ->  Attention(q, k, ...)       (the same for v)

The repeat_kv the op does itself. Preconditions: the Unsqueeze inserts axis 2 of a 4-D k, the Expand's
output is (b, kv, n, s, d) and the Reshape's (b, kv * n, s, d), all static; or, with symbolic batch and
sequence, the Expand's shape is [1 or b, 1 or kv, n, 1, 1] and the Reshape's [0 or b, kv * n, -1 or s, d].

    Attention(T(R(q3)), T(R(k3)), T(R(v3)), mask) -> T -> R  ->  Attention(q3, k3, v3, mask, q_num_heads=h,
                                                                            kv_num_heads=kv)

(R: a Reshape between (batch, seq, heads * size) and (batch, seq, heads, size), T: Transpose (0, 2, 1, 3)):
the op's 3-D form splits and joins the heads itself (8 nodes per layer). Preconditions: each Reshape's
shape constant names the dims it makes (batch and seq copied by 0s or the same static dims, head count and
size), one of them may be -1; the qk_matmul_output unused. A cache stays as it is (past and present are 4-D in
both forms), the op taking over the present outputs.

Refused before opset 23 (``--target-opset 23`` raises it), where no valid place has an Attention kernel, and
when a precondition above fails, each with a sentence. Numeric effect: one kernel computes the same products
and softmax; results differ from the chain in the last bits (a masked row's -inf-like fill and, with two
masks, the order of the two additions), and where every key of a row is masked by -inf (NaN in an unguarded
chain) the op gives 0.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.attention_inputs import (HEADS_PERM, BooleanMask, CausalMask, KeysThroughThreeDims,
                                                           PastKeyValues, ScaledOperand, heads_layout)
from worker.engine.passes.support.operands import int_list
from worker.engine.passes.support.transformer_chains import ScaledDotProduct, static4
from worker.engine.passes.support.weights import FLOAT_TYPES, numpy_dtype
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


class RepeatKV(Rule):
    """Both the keys and the values repeated (the op needs them with the same head count)."""

    name = "attention_repeat_kv"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        repeated = []
        for which in ("k", "v"):
            unsqueezed = p.Unsqueeze(p.var(which), None, key=f"{which}_unsqueeze")
            expanded = p.Expand(unsqueezed, None, key=f"{which}_expand")
            repeated.append(p.Reshape(expanded, None, key=f"{which}_reshape"))
        p.Attention(None, *repeated, key="attention", out="out")
        return p

    def _refusal(self, match: Match, which: str) -> str | None:
        kv, reshape = match.value(which), match.node(f"{which}_reshape")
        unsqueeze = match.node(f"{which}_unsqueeze")
        shape, repeated = static4(kv), static4(reshape.outputs[0])
        expanded = match.node(f"{which}_expand").outputs[0].shape
        axes = int_list(unsqueeze.input(1)) if len(unsqueeze.inputs) > 1 else unsqueeze.attr("axes")
        if shape is None or repeated is None or expanded is None or list(axes or []) not in ([2], [-3]):
            return f"{describe(reshape)} does not repeat the heads of a 4-D {kv.name!r} of static shape"
        b, h, s, d = shape
        n = repeated[1] // h if h else 0
        if not (n and tuple(expanded) == (b, h, n, s, d) and repeated == (b, h * n, s, d)):
            return f"{describe(reshape)} does not repeat each head of {kv.name!r} {list(shape)} consecutively"
        return None

    def _symbolic_refusal(self, match: Match, which: str) -> str | None:
        """The same for symbolic batch and sequence, read from the Expand and Reshape shape constants: Expand to
        [1 or b, 1 or h, n, 1, 1] and Reshape to [0 or b, h * n, -1 or s, d] (or [.., s, -1])."""
        kv, reshape, expand = match.value(which), match.node(f"{which}_reshape"), match.node(f"{which}_expand")
        unsqueeze = match.node(f"{which}_unsqueeze")
        shape = kv.shape
        axes = int_list(unsqueeze.input(1)) if len(unsqueeze.inputs) > 1 else unsqueeze.attr("axes")
        target, new = int_list(expand.input(1)), int_list(reshape.input(1))
        refusal = f"{describe(reshape)} does not repeat each head of {kv.name!r} consecutively"
        if shape is None or len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int) or \
                list(axes or []) not in ([2], [-3]) or target is None or new is None or len(target) != 5 or \
                len(new) != 4:
            return refusal
        b, h, s, d = shape
        n = target[2]
        if n < 1 or target[0] not in (1, b) or target[1] not in (1, h) or target[3:] != [1, 1]:
            return refusal
        copies_batch = new[0] == 0 and not reshape.attr("allowzero", 0)
        if not (copies_batch or new[0] == b) or new[1] != h * n or \
                (new[2], new[3]) not in ((-1, d), (s, -1), (s, d)):
            return refusal
        return None

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        refusal = (self._refusal(match, "k") and self._symbolic_refusal(match, "k")) or \
            (self._refusal(match, "v") and self._symbolic_refusal(match, "v"))
        if refusal:
            return refusal
        if match.value("k").shape[1] != match.value("v").shape[1]:
            return f"the keys and values of {describe(match.node('attention'))} repeat different head counts"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        attention = match.node("attention")
        attention.set_input(1, match.value("k"))
        attention.set_input(2, match.value("v"))
        return attention


class HeadsLayout(Rule):
    """Attention over heads split out of (batch, seq, hidden) tensors and joined back takes them as they are.

        Attention(T(R(q3)), T(R(k3)), T(R(v3)), ...) -> T -> R   ->  Attention(q3, k3, v3, ..., q_num_heads,
                                                                              kv_num_heads)
    (R: Reshape (b, s, h * d) <-> (b, s, h, d), T: Transpose (0, 2, 1, 3)), the op's 3-D form."""

    pattern_args = ("cache",)

    def __init__(self, cache: bool):
        super().__init__()
        self.cache = cache
        self.name = f"attention_heads_layout{'_with_cache' if cache else ''}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        inputs = [p.Transpose(p.Reshape(p.var(f"{w}3"), None, key=f"{w}_reshape"), key=f"{w}_transpose",
                              attrs={"perm": HEADS_PERM}) for w in "qkv"]
        if self.cache:  # the present key and value (4-D in both forms) stay the op's outputs
            y4, _, _ = p.Attention(*inputs, key="attention", outputs=3, out=["y4", "present_k", "present_v"])
        else:
            y4 = p.Attention(*inputs, key="attention")
        p.Reshape(p.Transpose(y4, key="y_transpose", attrs={"perm": HEADS_PERM}), None, key="y_reshape", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple[int, int] | str:
        attention = match.node("attention")
        if any(v.is_used for v in attention.outputs[3:]):
            return f"{describe(attention)} has its qk_matmul_output used"
        reshaped = heads_layout(match)
        if isinstance(reshaped, str):
            return reshaped
        heads = [match.node(f"{w}_reshape").outputs[0].shape[2] for w in "qk"]
        return heads[0], heads[1], reshaped

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple[int, int, bool]) -> list[Node]:
        q_heads, kv_heads, reshaped = plan
        graph, attention, y_reshape = match.graph, match.node("attention"), match.node("y_reshape")
        inputs = [match.value("q3"), match.value("k3"), match.value("v3"), *attention.inputs[3:]]
        attributes = {**dict(attention.attributes), "q_num_heads": q_heads, "kv_num_heads": kv_heads}
        present = [match.value("present_k"), match.value("present_v")] if self.cache else []
        if reshaped:
            return [graph.add_node("Attention", inputs, outputs=[match.value("out"), *present], name=attention.name,
                                   before=attention, attributes=attributes)]
        # Where the old op was, so readers of the present key and value still come after it.
        fused = graph.add_node("Attention", inputs, outputs=[f"{attention.name}_out0", *present],
                               name=attention.name, before=attention, attributes=attributes)
        joined, y = y_reshape.inputs[0], fused.outputs[0]
        y.dtype, y.shape = joined.dtype, (joined.shape[0], joined.shape[1], joined.shape[2] * joined.shape[3])
        again = graph.add_node("Reshape", [y, y_reshape.inputs[1]], outputs=[match.value("out")],
                               name=y_reshape.name, before=y_reshape)
        return [fused, again]


@register_pass(name="attention_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn scaled dot-product attention written out as MatMul/Softmax/MatMul, with its "
                           "masks and grouped-query repeat_kv, into Attention (opset 23+)")
def attention_fuse(ctx: PassContext) -> PassResult:
    # The longest chains first, so a scale or mask goes into the op rather than staying before it.
    scales = ("split", "split_shared", "mul", "div", "none")
    rules = [ScaledDotProduct(scale, masks, float_softmax, nan_guard, fill) for nan_guard in (True, False)
             for float_softmax in (True, False)
             for masks, fill in ((2, ""), *((m, f) for m in (1, 0) for f in ("if_true", "if_false", "")))
             for scale in scales]
    # The cache before the causal mask: the op's causal triangle is offset by the cached keys, so a triangle is
    # only read as is_causal once the cache it is offset by is the op's past_key.
    inputs = [KeysThroughThreeDims(), RepeatKV(), PastKeyValues(), BooleanMask(), CausalMask(padded=True),
              CausalMask(padded=False), ScaledOperand(("", "Attention"), 0), ScaledOperand(("", "Attention"), 1),
              ScaledOperand(("", "Attention"), 1, transposed=True)]
    existing = {id(n) for graph in ctx.graph.live_graphs() for n in graph.nodes_of_type("Attention")}
    result = apply_rules(ctx, [*rules, *inputs, HeadsLayout(cache=True), HeadsLayout(cache=False)])
    # HeadsLayout replaces an op by one of the same name: one the model had keeps its own mask semantics.
    had = {n.name for graph in ctx.graph.live_graphs() for n in graph.nodes_of_type("Attention") if id(n) in existing}
    for graph in ctx.graph.live_graphs():
        lift_lowest_mask_fill(graph, [n for n in graph.nodes_of_type("Attention") if id(n) not in existing
                                      and n.name not in had])
    return result


def lift_lowest_mask_fill(graph, fused: list[Node]) -> None:
    """Give the float masks of the Attention ops this pass made Where(Equal(m, lowest), lowest + 1 ulp, m).

    onnxruntime's Attention kernel takes a mask element equal to the dtype's lowest value (the transformers
    library's and the dynamo exporter's fill) as -inf, so a query row whose keys are all masked comes out 0,
    where the chain it replaces adds the fill to the scores and averages the values over that row (a
    left-padded batch has such rows). One ulp above the lowest value the chain's sums and softmax are the same
    (both absorb any score below 2**103), and the kernel adds it as it is; -inf fills and other values stay.
    One pair of nodes per mask, shared by the ops that read it; a constant mask without the lowest value keeps
    none."""
    lifted: dict = {}
    for attention in fused:
        mask = attention.input(3) if len(attention.inputs) > 3 else None
        if mask is None or mask.dtype not in FLOAT_TYPES:
            continue
        if mask.name not in lifted:
            dtype = numpy_dtype(mask.dtype)
            lowest = np.finfo(dtype).min
            data = mask.constant_value()
            if data is not None and not (data == lowest).any():
                lifted[mask.name] = mask
                continue
            above_lowest = np.nextafter(lowest, dtype.type(0))
            if _lift_where_constants(graph, mask, lowest, above_lowest, fused):
                lifted[mask.name] = mask
                continue
            fill = graph.add_initializer(f"{mask.name}_lowest", np.array(lowest, dtype=dtype))
            above = graph.add_initializer(f"{mask.name}_above_lowest", np.array(above_lowest, dtype=dtype))
            equal = graph.add_node("Equal", [mask, fill], outputs=1, name=f"{mask.name}_is_lowest", before=attention)
            where = graph.add_node("Where", [equal.outputs[0], above, mask], outputs=1,
                                   name=f"{mask.name}_lifted", before=attention)
            equal.outputs[0].dtype, equal.outputs[0].shape = TensorProto.BOOL, mask.shape
            where.outputs[0].dtype, where.outputs[0].shape = mask.dtype, mask.shape
            lifted[mask.name] = where.outputs[0]
        attention.set_input(3, lifted[mask.name])


def _lift_where_constants(graph, mask, lowest, above_lowest, fused: list[Node]) -> bool:
    """The usual mask, Where(condition, constant, constant) read only by the ops made here, lifted in place:
    its constant branches become copies with the lowest value one ulp up (no node added)."""
    where = mask.producer
    readers = {id(n) for n in fused}
    if where is None or where.op_type != "Where" or where.domain or mask.is_graph_output or \
            any(id(u) not in readers for u in mask.consumers()):
        return False
    branches = [where.input(1), where.input(2)]
    data = [b.constant_value() if b is not None else None for b in branches]
    if any(d is None for d in data):
        return False
    for slot, (branch, values) in enumerate(zip(branches, data), start=1):
        if (values == lowest).any():
            where.set_input(slot, graph.add_initializer(f"{branch.name}_above_lowest",
                                                        np.where(values == lowest, above_lowest, values)))
    return True
