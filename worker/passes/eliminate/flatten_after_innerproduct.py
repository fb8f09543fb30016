"""eliminate_flatten_after_innerproduct: a Flatten(axis=1) of a Gemm output is removed.

    x -> Gemm -> g:[N,M] -> Flatten(axis=1) -> y:[N,M]    becomes    x -> Gemm -> g

(ncnn's eliminate_flatten_after_innerproduct.) A Gemm output has rank 2, so flattening it from axis 1 (or -1)
changes nothing, whatever N is. Exact.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class FlattenAfterGemmRule(ForwardRule):
    name = "eliminate_flatten_after_innerproduct"
    op_types = ("Flatten",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        source = node.input(0)
        producer = source.producer
        if producer is None or not producer.is_op("Gemm"):
            return None
        if node.attr("axis", 1) not in (1, -1):
            return None
        return source


@register_pass(name="eliminate_flatten_after_innerproduct", kind=PassKind.PROGRAM, level=1,
               description="remove Flatten(axis=1) after Gemm, whose output is already 2-D")
def eliminate_flatten_after_innerproduct(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [FlattenAfterGemmRule()])
