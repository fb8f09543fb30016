"""eliminate_pooling1x1: a MaxPool or AveragePool with a 1x1 window, stride 1 and no padding is removed.

    x -> MaxPool(kernel_shape=[1, 1], strides=[1, 1], pads=0) -> y    becomes    x

(ncnn's eliminate_pooling1x1.) Every window holds one element, so the output is the input. Refused when the
MaxPool Indices output is used. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


def is_1x1(node: Node) -> bool:
    """a 1x1 window, stride 1, no padding, no storage order"""
    kernel = node.attr("kernel_shape") or []
    return bool(kernel) and all(k == 1 for k in kernel) and all(s == 1 for s in node.attr("strides") or []) \
        and all(p == 0 for p in node.attr("pads") or []) and not node.attr("storage_order", 0)


class Pooling1x1Rule(Rule):
    name = "eliminate_pooling1x1"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(("MaxPool", "AveragePool"), p.var("x"), when=is_1x1)
        return p

    def check(self, ctx: PassContext, match: Match) -> Value:
        return match.value("x")


@register_pass(name="eliminate_pooling1x1", peer="ncnn", kind=PassKind.PROGRAM, level=1,
               description="remove MaxPool/AveragePool with a 1x1 window, stride 1 and no padding")
def eliminate_pooling1x1(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [Pooling1x1Rule()])
