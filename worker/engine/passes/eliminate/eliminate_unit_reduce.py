"""eliminate_unit_reduce: a reduction over axes that hold one element each leaves every element as it is.

    x:[1, 128, 4, 1] -> ReduceSum(axes=[-1], keepdims=1) -> y    becomes    x
    x:[1, 128, 4, 1] -> ReduceMean(axes=[-1], keepdims=0) -> y   becomes    x -> Squeeze([3]) -> y

A sum, mean, maximum, minimum or product of one element is that element (a log-sum-exp too, but for the
overflow of its exponential, which a runtime computing it as written keeps: left alone). timm's MobileViT-v2 at
64x64 reaches its last stage with one patch: its separable attention sums context scores over that one
position, after eliminate_unit_softmax has made the scores ones (onnxsim removes the three ReduceSums, mirserve
kept them). Preconditions: the reduced axes known (attribute or constant input per opset, every axis when none
are given and ``noop_with_empty_axes`` is 0), each of static extent 1. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.eliminate.fuse_consecutive_reduce_unsqueeze import reduced_axes
from worker.engine.passes.eliminate.fuse_consecutive_squeezes import set_axes
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, forward_refusal

#: Reductions whose result over one element is that element.
IDENTITY_ON_ONE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")


class UnitReduceRule(Rule):
    name = "eliminate_unit_reduce"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(IDENTITY_ON_ONE, p.var("x"), key="reduce", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | list[int] | str | None:
        source, reduce = match.value("x"), match.node("reduce")
        if source.shape is None:
            return None
        axes = reduced_axes(reduce, len(source.shape), ctx.opset())
        if axes is None or not all(source.shape[a] == 1 for a in axes):
            return None  # nothing known to hold one element per reduction
        if not reduce.attr("keepdims", 1):
            return axes  # the axes go: a Squeeze
        return forward_refusal(match, source) or source

    def rewrite(self, ctx: PassContext, match: Match, axes: list[int]) -> Node:
        reduce = match.node("reduce")
        squeeze = match.graph.add_node("Squeeze", [match.value("x")], [match.value("y")], name=reduce.name,
                                       before=reduce)
        set_axes(match.graph, squeeze, axes, ctx.opset())
        return squeeze


@register_pass(name="eliminate_unit_reduce", kind=PassKind.PROGRAM, level=1,
               description="a sum / mean / max / min / product over axes of one element is its input (a "
                           "Squeeze without keepdims)")
def eliminate_unit_reduce(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [UnitReduceRule()])
