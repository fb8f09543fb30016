"""eliminate_nop_pad: a Pad that adds nothing on any side is removed.

    x -> Pad(pads=[0, 0, 0, 0]) -> y    becomes    x

Pads are an attribute before opset 11 (``paddings`` in opset 1) and a constant input from it on; every pad
must be zero, whatever the mode. Exact.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import int_list
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class NopPadRule(ForwardRule):
    name = "eliminate_nop_pad"
    op_types = ("Pad",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        if ctx.opset() >= 11:
            pads = int_list(node.input(1))
            if pads is None:
                return "its pads are not known at optimization time"
        else:
            pads = node.attr("pads", node.attr("paddings"))
            if pads is None:
                return "it has no pads attribute"
        if any(int(p) != 0 for p in pads):
            return None
        return node.input(0)


@register_pass(name="eliminate_nop_pad", kind=PassKind.PROGRAM, level=1,
               description="remove Pad whose pads are all zero")
def eliminate_nop_pad(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [NopPadRule()])
