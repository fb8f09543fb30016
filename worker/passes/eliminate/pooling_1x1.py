"""eliminate_pooling1x1: a MaxPool or AveragePool with a 1x1 window, stride 1 and no padding is removed.

    x -> MaxPool(kernel_shape=[1, 1], strides=[1, 1], pads=0) -> y    becomes    x

(ncnn's eliminate_pooling1x1.) Every window holds one element, so the output is the input. Refused when the
MaxPool Indices output is used. Exact.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class Pooling1x1Rule(ForwardRule):
    name = "eliminate_pooling1x1"
    op_types = ("MaxPool", "AveragePool")

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        kernel = node.attr("kernel_shape") or []
        if not kernel or any(k != 1 for k in kernel):
            return None
        if any(s != 1 for s in node.attr("strides") or []):
            return None
        if any(p != 0 for p in node.attr("pads") or []):
            return None
        if node.attr("storage_order", 0):
            return None
        return node.input(0)


@register_pass(name="eliminate_pooling1x1", kind=PassKind.PROGRAM, level=1,
               description="remove MaxPool/AveragePool with a 1x1 window, stride 1 and no padding")
def eliminate_pooling1x1(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [Pooling1x1Rule()])
