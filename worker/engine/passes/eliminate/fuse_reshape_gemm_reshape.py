"""fuse_reshape_gemm_reshape: a Gemm over the rows of a tensor whose leading axes were merged for it, and split
back as they were, is a MatMul of the tensor itself (with the bias added).

    x:[b, s, K] -> Reshape(-1, K) -> Gemm(B:[K, N], C:[N]) -> Reshape(b, s, N) -> y
        becomes    x -> MatMul(B) -> Add(C) -> y        (x -> MatMul(B) -> y without C)

GPT-2's Conv1D (``x.view(-1, nx)``, ``addmm``, ``view(*x.size()[:-1], nf)``) is written this way by both
exporters, four times a layer (dynamo with or without the bias in the Gemm); with a dynamic batch and sequence
the second Reshape's shape is computed from x's (Shape, Gather, Unsqueeze, Concat), which goes with it. Exact:
each output row is the dot products of one row of x with B's columns either way, and a row-major Reshape that
merges the leading axes and splits them again moves no element.

Preconditions: the first Reshape's shape is [-1, K] or the static product of x's leading dims, K x's last dim
(no 0 in it, so allowzero, which the dynamo exporter sets, reads it alike); Gemm with alpha 1, beta 1, no
transposed A, a constant B (transposed here when transB) and a bias of N values (or [1, N]) or none; the
second Reshape's shape is x's leading dims (the same dims by value or by the model's names: read through
``inference.dims_vector``) then N; the intermediates read by nothing else.
"""
from __future__ import annotations

import math

import numpy as np

from worker.engine.inference import dims_vector, same_dims
from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.operands import int_list
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class ReshapeGemmReshape(Rule):
    name = "fuse_reshape_gemm_reshape"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        rows = p.Reshape(p.var("x"), p.var("merge_shape"), key="merge", out="rows")
        product = p.Gemm(rows, p.var("b"), key="gemm", out="product")  # a bias or none (dynamo folds it in)
        p.Reshape(product, p.var("split_shape"), key="split", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str:
        """B as MatMul takes it ([K, N]), or why not."""
        x, gemm = match.value("x"), match.node("gemm")
        if x.shape is None or len(x.shape) < 2 or not isinstance(x.shape[-1], int):
            return "the input's rank or last dim is not known"
        k, leading = x.shape[-1], x.shape[:-1]
        merge = int_list(match.value("merge_shape"))
        whole = math.prod(leading) if all(isinstance(d, int) for d in leading) else None
        if merge is None or len(merge) != 2 or merge[1] != k or merge[0] not in (-1, whole) or merge[0] == 0:
            return "the first Reshape does not merge the leading axes alone"
        if gemm.attr("alpha", 1.0) != 1.0 or gemm.attr("beta", 1.0) != 1.0 or gemm.attr("transA", 0):
            return "the Gemm scales or transposes its input"
        b = match.value("b").constant_value()
        if b is None or b.ndim != 2:
            return "B is not a constant matrix"
        b = b.T if gemm.attr("transB", 0) else b
        n = b.shape[1]
        bias = gemm.input(2) if len(gemm.inputs) > 2 else None
        if b.shape[0] != k or (bias is not None and (bias.shape is None or tuple(bias.shape) not in ((n,), (1, n)))):
            return "B or the bias does not match the rows"
        split = dims_vector(match.value("split_shape"))
        if split is None or len(split) != len(leading) + 1 or split[-1] != n or not same_dims(split[:-1], leading):
            return "the second Reshape does not split the rows into the input's leading dims"
        return b

    def rewrite(self, ctx: PassContext, match: Match, b: np.ndarray) -> list[Node]:
        graph, gemm, split = match.graph, match.node("gemm"), match.node("split")
        weight = match.value("b")
        if gemm.attr("transB", 0):
            weight = graph.root.add_initializer(f"{gemm.name}_weight", np.ascontiguousarray(b))
        bias = gemm.input(2) if len(gemm.inputs) > 2 else None  # [N] or [1, N]: broadcasts over the leading dims
        y = match.value("y")
        if bias is None:
            return [graph.add_node("MatMul", [match.value("x"), weight], [y], name=gemm.name, before=split)]
        matmul = graph.add_node("MatMul", [match.value("x"), weight], [f"{gemm.name}_matmul_out"], name=gemm.name,
                                before=split)
        matmul.output(0).dtype, matmul.output(0).shape = y.dtype, y.shape
        add = graph.add_node("Add", [matmul.output(0), bias], [y], name=f"{gemm.name}_bias", before=split)
        return [matmul, add]


@register_pass(name="fuse_reshape_gemm_reshape", kind=PassKind.PROGRAM, level=1,
               description="Reshape merging leading axes -> Gemm -> Reshape splitting them again -> MatMul + Add "
                           "(GPT-2's Conv1D)")
def fuse_reshape_gemm_reshape(ctx: PassContext) -> PassResult:
    if ctx.opset() < 5:
        return PassResult()  # Reshape keeps its shape as an attribute before opset 5
    return apply_rules(ctx, [ReshapeGemmReshape()])
