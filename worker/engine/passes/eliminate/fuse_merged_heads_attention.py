"""fuse_merged_heads_attention: attention written as batched matmuls over the heads merged into the batch
(``view(b * h, s, d)`` then ``bmm``) is the same attention over 4-D (batch, heads, seq, size) tensors, the form
the attention fusions read.

    MatMul(Reshape(q4, (n, s, d)), Transpose(Reshape(k4, (n, t, d)), (0, 2, 1)))
        -> Reshape(MatMul(q4, Transpose(k4, (0, 1, 3, 2))), (n, s, t))                  (the scores)
    MatMul(q4, Transpose(Reshape(k4, (h, t, d)), (0, 2, 1)))            (k4 (1, h, t, d), q4 (b, h, s, d))
        -> MatMul(q4, Transpose(k4, (0, 1, 3, 2)))                   (the scores, the query left 4-D)
    Reshape(MatMul(Softmax(Reshape(s4, (n, s, t))), Reshape(v4, (n, t, d))), (b, h, s, d))
        -> MatMul(Softmax(s4), v4)                                                      (the weighted values)
    MatMul(Softmax(Reshape(s4, (h, s, t))), v4)                         (s4 (1, h, s, t), v4 (b, h, t, d))
        -> MatMul(Softmax(s4), v4)                                   (the weights broadcast against 4-D values)

n = b * h. The attention classes the transformers library kept from CLIP and BART (GroupViT, Table Transformer,
the DETR family) write their attention this way, and the dynamo exporter's optimizer drops the query's merge
when the batch is 1, leaving a 4-D query times 3-D keys, whose broadcast reads the keys as (1, h, d, t) (and
3-D weights times 4-D values likewise). Exact:
batch element n = i * h + j of a merged bmm is the product of the 4-D operands at (i, j), a row-major Reshape
that only merges or splits the leading two axes moves no element, and Softmax over the last axis normalizes the
same rows in either shape.

Preconditions: static shapes; q4, k4 and v4 are 4-D with equal leading (batch, heads) and head sizes; each
Reshape merges the leading two axes alone (or splits them back, for the output); Softmax over the last axis
(opset 13+, where it normalizes one axis); the merged intermediates read by nothing else.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.shapes import static_shape
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

SWAP_LAST = [0, 2, 1]


def merges_heads(source, merged) -> bool:
    """Whether ``merged`` is the static 4-D ``source`` with its leading two axes merged into one."""
    x, y = static_shape(source), static_shape(merged)
    return x is not None and y is not None and len(x) == 4 and y == (x[0] * x[1], x[2], x[3])


def _transposed_keys(graph, k4, before: Node, name: str):
    """Transpose(k4, (0, 1, 3, 2)), typed."""
    swap = graph.add_node("Transpose", [k4], [f"{name}_keys_transposed"], name=f"{name}_keys_transposed",
                          attributes={"perm": [0, 1, 3, 2]}, before=before)
    kt = swap.output(0)
    b, h, t, d = k4.shape
    kt.dtype, kt.shape = k4.dtype, (b, h, d, t)
    return swap, kt


def _softmax_refusal(ctx: PassContext, softmax: Node) -> str | None:
    if ctx.opset() < 13 or softmax.attr("axis", -1) not in (-1, 2):
        return "the Softmax does not normalize the last axis alone (opset 13+)"
    return None


def _weighted_values(match: Match, before: Node) -> list[Node]:
    """MatMul(Softmax(s4), v4) writing the pattern's y4, in place of the merged Softmax and MatMul."""
    graph, values, softmax, s4 = match.graph, match.node("values"), match.node("softmax"), match.value("s4")
    normalized = graph.add_node("Softmax", [s4], [f"{softmax.name}_heads"], name=softmax.name,
                                attributes={"axis": -1}, before=before)
    w4 = normalized.output(0)
    w4.dtype, w4.shape = softmax.output(0).dtype, s4.shape
    matmul = graph.add_node("MatMul", [w4, match.value("v4")], [match.value("y4")], name=values.name,
                            before=before)
    return [normalized, matmul]


class MergedHeadsScores(Rule):
    """MatMul(Reshape(q4, (n, s, d)), Transpose(Reshape(k4, (n, t, d)), (0, 2, 1))) -> Reshape(MatMul(q4,
    Transpose(k4, (0, 1, 3, 2))), (n, s, t))."""

    name = "fuse_merged_heads_attention_scores"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        q3 = p.Reshape(p.var("q4"), None, key="q_merge")
        k3 = p.Reshape(p.var("k4"), None, key="k_merge")
        kt3 = p.Transpose(k3, key="k_swap", attrs={"perm": SWAP_LAST})
        p.MatMul(q3, kt3, key="scores", out="s3")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        q4, k4 = match.value("q4"), match.value("k4")
        if not merges_heads(q4, match.node("q_merge").output(0)) or \
                not merges_heads(k4, match.node("k_merge").output(0)):
            return "the query and keys are not 4-D tensors of static shape with their leading two axes merged"
        if q4.shape[:2] != k4.shape[:2] or q4.shape[3] != k4.shape[3]:
            return "the query and keys differ in batch, heads or head size"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> list[Node]:
        graph, scores, s3 = match.graph, match.node("scores"), match.value("s3")
        q4, k4 = match.value("q4"), match.value("k4")
        swap, kt = _transposed_keys(graph, k4, scores, scores.name)
        matmul = graph.add_node("MatMul", [q4, kt], [f"{scores.name}_heads"], name=scores.name, before=scores)
        s4 = matmul.output(0)
        s4.dtype, s4.shape = s3.dtype, (*q4.shape[:3], k4.shape[2])
        shape = graph.root.add_initializer(f"{scores.name}_merged_shape", np.array(s3.shape, np.int64))
        merge = graph.add_node("Reshape", [s4, shape], [s3], name=f"{scores.name}_merge", before=scores)
        return [swap, matmul, merge]


class BroadcastKeysScores(Rule):
    """MatMul(q4, Transpose(Reshape(k4, (h, t, d)), (0, 2, 1))) -> MatMul(q4, Transpose(k4, (0, 1, 3, 2))),
    k4 (1, h, t, d): the 3-D keys broadcast against the 4-D query as (1, h, d, t)."""

    name = "fuse_merged_heads_attention_broadcast_keys"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        k3 = p.Reshape(p.var("k4"), None, key="k_merge")
        kt3 = p.Transpose(k3, key="k_swap", attrs={"perm": SWAP_LAST})
        p.MatMul(p.var("q4"), kt3, key="scores", out="s4")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        q, k4 = static_shape(match.value("q4")), match.value("k4")
        if q is None or len(q) != 4 or not merges_heads(k4, match.node("k_merge").output(0)) or k4.shape[0] != 1:
            return "the query is not 4-D or the keys are not (1, heads, seq, size) with their leading axes merged"
        if q[1] != k4.shape[1] or q[3] != k4.shape[3]:
            return "the query and keys differ in heads or head size"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> list[Node]:
        graph, scores = match.graph, match.node("scores")
        swap, kt = _transposed_keys(graph, match.value("k4"), scores, scores.name)
        matmul = graph.add_node("MatMul", [match.value("q4"), kt], [match.value("s4")], name=scores.name,
                                before=scores)
        return [swap, matmul]


class MergedHeadsWeights(Rule):
    """Reshape(MatMul(Softmax(Reshape(s4, (n, s, t))), Reshape(v4, (n, t, d))), (b, h, s, d)) -> MatMul(Softmax(s4),
    v4)."""

    name = "fuse_merged_heads_attention_values"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        s3 = p.Reshape(p.var("s4"), None, key="s_merge")
        w3 = p.Softmax(s3, key="softmax")
        v3 = p.Reshape(p.var("v4"), None, key="v_merge")
        y3 = p.MatMul(w3, v3, key="values")
        p.Reshape(y3, None, key="split", out="y4")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        s4, v4, y4 = match.value("s4"), match.value("v4"), match.value("y4")
        softmax = match.node("softmax")
        refusal = _softmax_refusal(ctx, softmax)
        if refusal:
            return refusal
        if not merges_heads(s4, softmax.input(0)) or not merges_heads(v4, match.node("v_merge").output(0)):
            return "the scores and values are not 4-D tensors of static shape with their leading two axes merged"
        if s4.shape[:2] != v4.shape[:2] or s4.shape[3] != v4.shape[2]:
            return "the scores and values differ in batch, heads or keys"
        if static_shape(y4) != (*s4.shape[:3], v4.shape[3]):
            return "the output is not split back into the scores' batch and heads"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> list[Node]:
        return _weighted_values(match, before=match.node("split"))


class BroadcastWeightsValues(Rule):
    """MatMul(Softmax(Reshape(s4, (h, s, t))), v4) -> MatMul(Softmax(s4), v4), s4 (1, h, s, t), v4 (b, h, t, d): the
    3-D weights broadcast against the 4-D values as (1, h, s, t)."""

    name = "fuse_merged_heads_attention_broadcast_weights"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        s3 = p.Reshape(p.var("s4"), None, key="s_merge")
        w3 = p.Softmax(s3, key="softmax")
        p.MatMul(w3, p.var("v4"), key="values", out="y4")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        s4, v = match.value("s4"), static_shape(match.value("v4"))
        softmax = match.node("softmax")
        refusal = _softmax_refusal(ctx, softmax)
        if refusal:
            return refusal
        if v is None or len(v) != 4 or not merges_heads(s4, softmax.input(0)) or s4.shape[0] != 1:
            return "the values are not 4-D or the scores are not (1, heads, seq, keys) with their leading axes merged"
        if s4.shape[1] != v[1] or s4.shape[3] != v[2]:
            return "the scores and values differ in heads or keys"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> list[Node]:
        return _weighted_values(match, before=match.node("values"))


@register_pass(name="fuse_merged_heads_attention", kind=PassKind.PROGRAM, level=1,
               description="attention as batched matmuls over the heads merged into the batch -> the same "
                           "attention over 4-D (batch, heads, seq, size) tensors (CLIP / BART-style bmm attention)")
def fuse_merged_heads_attention(ctx: PassContext) -> PassResult:
    if ctx.opset() < 5:
        return PassResult()  # Reshape keeps its shape as an attribute before opset 5
    return apply_rules(ctx, [MergedHeadsScores(), BroadcastKeysScores(), MergedHeadsWeights(), BroadcastWeightsValues()])
