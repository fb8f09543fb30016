"""attention_fuse: scaled dot-product attention written out as MatMul/Softmax/MatMul becomes the Attention op
(opset 23+), and grouped-query attention's repeat_kv goes into the op.

    s = MatMul(q, kT) [* c | / c] [+ mask [+ mask2]]
    y = MatMul(Softmax(s, axis=-1), v)        ->  Attention(q, Transpose(kT, [0, 1, 3, 2]), v, mask, scale=c)

q (batch, q_heads, seq, head), kT (batch, kv_heads, head, kv_seq) and v (batch, kv_heads, kv_seq, v_head) are
4-D with static head counts and equal batches, and q_heads a multiple of kv_heads (the op repeats each KV head
for q_heads / kv_heads consecutive query heads, as the transformers library's repeat_kv does). The key
transpose the op needs is emitted as a Transpose of kT; consecutive-transpose fusion then cancels it against
the Transpose that made kT (BERT's (0, 2, 3, 1), Llama's (0, 1, 3, 2)). The scale is a scalar constant (1
without one: BERT's dynamo export folds it into the query weights); two added masks (T5's position bias and
its padding mask) become one Add feeding attn_mask. Masks here are the exporters' additive float masks;
causal masking is part of them, so is_causal stays 0.

    Attention(q, Reshape(Expand(Unsqueeze(k, [2]), [b, kv, n, s, d]), [b, kv * n, s, d]), ...)
                                              ->  Attention(q, k, ...)       (the same for v)

The repeat_kv the op does itself. Preconditions: the Unsqueeze inserts axis 2 of a 4-D k, the Expand's
output is (b, kv, n, s, d) and the Reshape's (b, kv * n, s, d), all static.

Refused before opset 23 (``--target-opset 23`` raises it), where no valid place has an Attention kernel, and
when a precondition above fails, each with a sentence. Numeric effect: one kernel computes the same products
and softmax; results differ from the chain in the last bits (a masked row's -inf-like fill and, with two
masks, the order of the two additions).
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.normalization import scalar
from worker.engine.passes.support.operands import int_list
from worker.engine.passes.support.standard_ops import standard_op_refusal
from worker.engine.passes.support.weights import FLOAT_TYPES
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


def static4(value) -> tuple[int, int, int, int] | None:
    shape = value.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def broadcast(a: tuple, b: tuple) -> tuple:
    """The shape of a + b (a dim of 1 gives way to the other; symbolic dims kept)."""
    a, b = (1,) * (len(b) - len(a)) + tuple(a), (1,) * (len(a) - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


class ScaledDotProduct(Rule):
    def __init__(self, scale: str, masks: int):
        super().__init__()
        self.scale, self.masks = scale, masks
        self.name = f"attention_{scale}_{masks}_masks"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        scores = p.MatMul(p.var("q"), p.var("kt"), key="qk")
        if self.scale != "none":
            scores = p.op("Mul" if self.scale == "mul" else "Div", scores, p.var("c"), key="scale",
                          commutative=self.scale == "mul")
        for i in range(self.masks):
            scores = p.Add(scores, p.var(f"mask{i}"), key=f"add{i}", commutative=True)
        weights = p.Softmax(scores, key="softmax")
        p.MatMul(weights, p.var("v"), key="pv", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> float | str:
        """The scale, or why the chain is not an Attention."""
        refusal = standard_op_refusal(ctx, "Attention", 23)
        if refusal:
            return refusal
        qk, q, kt, v = match.node("qk"), match.value("q"), match.value("kt"), match.value("v")
        shapes = [static4(x) for x in (q, kt, v)]
        if None in shapes or q.dtype not in FLOAT_TYPES:
            return f"the operands of {describe(qk)} and the values are not 4-D float tensors of static shape"
        (b, hq, s, d), (bk, hk, dk, skv), (bv, hv, sv, dv) = shapes
        if not (b == bk == bv and d == dk and skv == sv and hk == hv and hk and hq % hk == 0):
            return (f"{describe(qk)} does not read query {list(shapes[0])}, transposed keys {list(shapes[1])} and "
                    f"values {list(shapes[2])} of one batch with query heads a multiple of key-value heads")
        axis = match.node("softmax").attr("axis", -1)
        if axis % 4 != 3:
            return f"{describe(match.node('softmax'))} does not normalize over the keys (axis {axis})"
        for i in range(self.masks):
            mask = match.value(f"mask{i}")
            if mask.dtype != q.dtype or mask.shape is None or len(mask.shape) > 4:
                return f"the mask {mask.name!r} is not a float tensor of rank 4 at most"
        if self.scale == "none":
            return 1.0
        c = scalar(match.value("c"))
        if c is None or c == 0:
            return f"the scale {match.value('c').name!r} of {describe(match.node('scale'))} is not a nonzero constant"
        return c if self.scale == "mul" else 1.0 / c

    def rewrite(self, ctx: PassContext, match: Match, scale: float) -> list[Node]:
        graph, anchor = match.graph, match.node("pv")
        created = [graph.add_node("Transpose", [match.value("kt")], outputs=1, name=f"{anchor.name}_keys",
                                  before=anchor, attributes={"perm": [0, 1, 3, 2]})]
        kt = match.value("kt")
        keys = created[0].outputs[0]
        keys.dtype, keys.shape = kt.dtype, (*kt.shape[:2], kt.shape[3], kt.shape[2])
        inputs = [match.value("q"), keys, match.value("v")]
        if self.masks == 2:
            masks = [match.value("mask0"), match.value("mask1")]
            created.append(graph.add_node("Add", masks, outputs=1, name=f"{anchor.name}_mask", before=anchor))
            total = created[-1].outputs[0]
            total.dtype, total.shape = masks[0].dtype, broadcast(masks[0].shape, masks[1].shape)
            inputs.append(total)
        elif self.masks == 1:
            inputs.append(match.value("mask0"))
        created.append(graph.add_node("Attention", inputs, outputs=[match.value("out")], name=anchor.name,
                                      before=anchor, attributes={"scale": float(scale)}))
        return created


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

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        refusal = self._refusal(match, "k") or self._refusal(match, "v")
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


@register_pass(name="attention_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn scaled dot-product attention written out as MatMul/Softmax/MatMul, with its "
                           "masks and grouped-query repeat_kv, into Attention (opset 23+)")
def attention_fuse(ctx: PassContext) -> PassResult:
    # The longest chains first, so a scale or mask goes into the op rather than staying before it.
    rules = [ScaledDotProduct(scale, masks) for masks in (2, 1, 0) for scale in ("mul", "div", "none")]
    return apply_rules(ctx, [*rules, RepeatKV()])
