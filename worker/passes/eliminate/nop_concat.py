"""eliminate_nop_concat: a Concat of one tensor (the others empty along the axis) is removed.

    x -> Concat(x) -> y    becomes    x
    Concat(x, e:[N,0]) -> y    becomes    x    (e statically empty along the axis)

Exact. The empty inputs must have a static zero along the axis.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


def _is_empty_along(value: Value, axis: int) -> bool:
    if value.shape is None or not value.shape:
        return False
    return value.shape[axis % len(value.shape)] == 0


class NopConcatRule(ForwardRule):
    name = "eliminate_nop_concat"
    op_types = ("Concat",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        inputs = [v for v in node.inputs if v is not None]
        if len(inputs) == 1:
            return inputs[0]
        axis = node.attr("axis", 0)
        kept = [v for v in inputs if not _is_empty_along(v, axis)]
        if len(kept) == 1 and kept[0].shape is not None and len(kept[0].shape) == len(node.output().shape or ()):
            return kept[0]
        return None


@register_pass(name="eliminate_nop_concat", kind=PassKind.PROGRAM, level=1,
               description="remove Concat of a single (non-empty) input")
def eliminate_nop_concat(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [NopConcatRule()])
