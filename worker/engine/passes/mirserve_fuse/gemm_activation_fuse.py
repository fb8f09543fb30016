"""gemm_activation_fuse: a Gemm or MatMul and the activation after it become one
mirserve.FusedGemm<Act> / FusedMatMul<Act> (ncnn's fuse_innerproduct_activation).

    Gemm(A, B[, C]) -> act              =>  mirserve.FusedGemm<Act>(A, B, C or 0)
    MatMul(A, B) -> act                 =>  mirserve.FusedMatMul<Act>(A, B)

The activation forms, preconditions and numeric effect are those of ``support/activation_fusion.py``.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.activation_fusion import activation_rules
from worker.engine.pattern import apply_rules


@register_pass(name="gemm_activation_fuse", peer="ncnn", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Gemm / MatMul followed by an activation -> mirserve.FusedGemm<Act> / FusedMatMul<Act>")
def gemm_activation_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, activation_rules({"Gemm": ("Gemm",), "MatMul": ("MatMul",)}))
