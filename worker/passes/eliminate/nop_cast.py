"""eliminate_nop_cast: a Cast (or CastLike) to the element type its input already has is removed.

    x:float -> Cast(to=float) -> y    becomes    x

Needs the input's element type from type inference. Exact.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class NopCastRule(ForwardRule):
    name = "eliminate_nop_cast"
    op_types = ("Cast", "CastLike")

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        source = node.input(0)
        if not source.dtype:
            return "the element type of its input is not known"
        if node.op_type == "Cast":
            target = node.attr("to")
        else:
            like = node.input(1)
            target = like.dtype if like is not None else 0
        if target != source.dtype:
            return None  # a real conversion
        return source


@register_pass(name="eliminate_nop_cast", kind=PassKind.PROGRAM, level=1,
               description="remove Cast/CastLike to the element type the input already has")
def eliminate_nop_cast(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [NopCastRule()])
