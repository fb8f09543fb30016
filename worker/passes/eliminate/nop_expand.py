"""eliminate_nop_expand: an Expand that broadcasts to the shape its input already has is removed.

    x:[N,3,8] -> Expand([1, 1]) -> y:[N,3,8]    becomes    x

Either type inference knows both shapes and they are equal, or the constant target shape is all ones and no
longer than the input's rank (which broadcasts to the input's own shape). Exact.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import int_list, same_shape
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class NopExpandRule(ForwardRule):
    name = "eliminate_nop_expand"
    op_types = ("Expand",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        source, out = node.input(0), node.output(0)
        if same_shape(source.shape, out.shape):
            return source
        target = int_list(node.input(1))
        if target is not None and source.rank is not None and len(target) <= source.rank \
                and all(t == 1 for t in target):
            return source
        if source.is_static and out.is_static:
            return None  # a real broadcast
        return "the shapes are not known to be equal"


@register_pass(name="eliminate_nop_expand", kind=PassKind.PROGRAM, level=1,
               description="remove Expand to the shape the input already has")
def eliminate_nop_expand(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [NopExpandRule()])
