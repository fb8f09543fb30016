"""eliminate_nop_transpose: a Transpose whose permutation keeps every axis in place is removed.

    x -> Transpose(perm=[0, 1, 2]) -> y    becomes    x

Without ``perm`` a Transpose reverses the axes, which is the identity only for rank 0 or 1. Exact.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class NopTransposeRule(ForwardRule):
    name = "eliminate_nop_transpose"
    op_types = ("Transpose",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        source = node.input(0)
        perm = node.attr("perm")
        if perm is None:  # reverses the axes: the identity only up to rank 1
            if source.rank is None:
                return "the rank of its input is not known"
            return source if source.rank <= 1 else None
        if list(perm) != list(range(len(perm))):
            return None
        return source


@register_pass(name="eliminate_nop_transpose", kind=PassKind.PROGRAM, level=1,
               description="remove Transpose with the identity permutation")
def eliminate_nop_transpose(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [NopTransposeRule()])
