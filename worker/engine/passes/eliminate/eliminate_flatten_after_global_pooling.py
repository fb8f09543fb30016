"""eliminate_flatten_after_global_pooling: global pooling followed by Flatten/Reshape to [N, C] becomes one
reduction that drops the spatial axes.

    x:[N,C,H,W] -> GlobalAveragePool -> [N,C,1,1] -> Flatten(axis=1) -> y:[N,C]
        becomes    x -> ReduceMean(axes=[2,3], keepdims=0) -> y            (GlobalMaxPool: ReduceMax)

(ncnn's eliminate_flatten_after_global_pooling and eliminate_reshape_after_global_pooling: ncnn's global
pooling already yields a flat vector; ONNX's keeps the unit axes, which the reduction drops.) The Reshape must
give [N, C] (from type inference, or a target such as [0, -1], [N, -1] or [-1, C]); the pooled tensor must
have no other reader; the reduction must get a place as good as the pooling's (placement_refusal: else
reduction_global_pool_replace makes this pattern, and the two would undo each other). Axes are an attribute
of ReduceMean/ReduceMax before opset 18, an input from it on. The same sums, in the same order: exact up to
the runtime's reduction order.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import AXES_AS_INPUT_SINCE, int_list
from worker.engine.passes.support.placement import constant_facts, placement_refusal, planned_facts
from worker.engine.passes.support.shapes import same_dim
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

POOL_TO_REDUCE = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}


def _target_gives_rows(target: list[int], pooled) -> bool:
    """A Reshape target that turns [N, C, 1, ...] into [N, C]."""
    if len(target) != 2 or target.count(-1) > 1:
        return False
    n, c = pooled[0], pooled[1]
    first = target[0] == 0 or (isinstance(n, int) and target[0] == n)
    second = target[1] == 0 or (isinstance(c, int) and target[1] == c)
    return (first and (second or target[1] == -1)) or (second and target[0] == -1)


def flattens_to_rows(node: Node, pooled: Value) -> bool:
    rank = pooled.rank
    if node.op_type == "Flatten":
        return rank is not None and node.attr("axis", 1) % rank == 1
    out = node.output()
    if pooled.shape is None:
        return False
    if out.shape is not None and len(out.shape) == 2 and same_dim(out.shape[0], pooled.shape[0]) \
            and same_dim(out.shape[1], pooled.shape[1]):
        return True
    target = int_list(node.input(1))
    return target is not None and not node.attr("allowzero", 0) and _target_gives_rows(target, pooled.shape)


class FlattenAfterGlobalPooling(Rule):
    name = "eliminate_flatten_after_global_pooling"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        pooled = p.op(tuple(POOL_TO_REDUCE), p.var("x"), key="pool", out="pooled")
        p.op(("Flatten", "Reshape"), pooled, key="flatten", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        source, node = match.value("x"), match.node("flatten")
        if source.rank is None or source.rank < 3:
            return "the rank of the pooled input is not known"
        if node.op_type == "Reshape" and ctx.opset() < 5:
            return "Reshape keeps its shape as an attribute before opset 5"
        if not flattens_to_rows(node, match.value("pooled")):
            return "it does not reshape to [N, C]"
        # the reduction must keep the pooling's place (ARM has pooling in fp16 NHWC, ReduceMean in fp32 NCHW
        # only): where pooling's is better, reduction_global_pool_replace makes this very pattern instead
        reduce_op, axes = POOL_TO_REDUCE[match.node("pool").op_type], list(range(2, source.rank))
        if ctx.opset() >= AXES_AS_INPUT_SINCE[reduce_op]:
            inputs, attributes = [source, constant_facts(TensorProto.INT64, (len(axes),))], {"keepdims": 0}
        else:
            inputs, attributes = [source], {"keepdims": 0, "axes": axes}
        facts = planned_facts(reduce_op, "", ctx.opset(""), inputs, [match.value("y")], attributes,
                              match.node("pool").name)
        return placement_refusal(ctx, facts, match.nodes) or True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        pool, source, graph = match.node("pool"), match.value("x"), match.graph
        reduce_op = POOL_TO_REDUCE[pool.op_type]
        axes = list(range(2, source.rank))
        if ctx.opset() >= AXES_AS_INPUT_SINCE[reduce_op]:
            name = f"{match.node('flatten').name}_axes"
            inputs = [source, graph.root.add_initializer(name, np.array(axes, dtype=np.int64))]
            attributes = {"keepdims": 0}
        else:
            inputs, attributes = [source], {"keepdims": 0, "axes": axes}
        return graph.add_node(reduce_op, inputs, [match.value("y")], name=f"{pool.name}_reduce",
                              attributes=attributes, before=match.node("flatten"))


@register_pass(name="eliminate_flatten_after_global_pooling", peer="ncnn", kind=PassKind.PROGRAM, level=1,
               description="global pooling + Flatten/Reshape to [N, C] become one ReduceMean/ReduceMax "
                           "without the unit axes")
def eliminate_flatten_after_global_pooling(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [FlattenAfterGlobalPooling()])
