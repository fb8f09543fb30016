"""gemm_bn_fuse: a BatchNormalization after a Gemm (or a 2-D MatMul with constant B) folds into the weights.

    BN(Gemm(A, B, C; alpha, beta))  ->  Gemm(A, B * a[n], a * beta * C + b; alpha, beta=1)
    BN(MatMul(A, B))                 ->  Gemm(A, B * a[n], b)
    with a = gamma / sqrt(var + epsilon), b = beta_bn - mean * a, per output column n

ncnn's fuse_innerproduct_batchnorm. B (and C) must be float constants, not DequantizeLinear outputs; the
statistics must be constants with one value per column.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.batchnorm import batchnorm_affine, batchnorm_refusal
from worker.engine.passes.support.gemm import gemm, two_d_refusal
from worker.engine.passes.support.weights import cast_like, constant_refusal, f64, fused_name
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class GemmBatchNorm(Rule):
    pattern_args = ("op",)

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.name = f"{op.lower()}_bn"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.op(self.op, p.var("a"), p.var("b"), key="fc")
        p.BatchNormalization(y, key="bn", out="out")
        return p

    def _columns(self, match: Match) -> int:
        fc, weight = match.node("fc"), match.value("b").constant_value()
        return weight.shape[0] if fc.attr("transB", 0) else weight.shape[1]

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        fc = match.node("fc")
        refusal = constant_refusal(fc, 1, "weights")
        if refusal:
            return refusal
        if fc.input(2) is not None:
            refusal = constant_refusal(fc, 2, "bias")
        elif self.op == "MatMul":
            refusal = two_d_refusal(fc, match.value("a"), match.value("b"))
        return refusal or batchnorm_refusal(match.node("bn"), self._columns(match)) or True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        fc, bn, graph = match.node("fc"), match.node("bn"), match.graph
        a, b = batchnorm_affine(bn)
        old_weight = match.value("b").constant_value()
        transposed = bool(fc.attr("transB", 0))
        weight = f64(old_weight) * (a[:, None] if transposed else a[None, :])
        bias = b
        if fc.input(2) is not None:
            bias = a * float(fc.attr("beta", 1.0)) * f64(fc.input(2).constant_value()) + b
        new_weight = graph.add_initializer(fused_name(match.value('b').name), cast_like(weight, old_weight))
        new_bias = graph.add_initializer(fused_name(f"{fc.name}_bias"), cast_like(bias, old_weight))
        attributes = dict(fc.attributes) if self.op == "Gemm" else {}
        node = gemm(graph, ctx, [match.value("a"), new_weight, new_bias], match.value("out"), attributes,
                    name=fc.name, before=bn)
        node.set_attr("beta", 1.0)
        return node

@register_pass(name="gemm_bn_fuse", peer="ncnn", kind=PassKind.PROGRAM, level=1,
               description="fold a BatchNormalization into the Gemm or 2-D MatMul before it")
def gemm_bn_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [GemmBatchNorm("Gemm"), GemmBatchNorm("MatMul")])
