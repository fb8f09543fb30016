"""fuse_consecutive_reduce_unsqueeze: a reduction that drops its axes, then an Unsqueeze that puts them back,
is the reduction keeping them.

    x:[1, 4, 16, 16] -> ReduceSum(axes=[-1], keepdims=0) -> s:[1, 4, 16] -> Unsqueeze([-1]) -> y:[1, 4, 16, 1]
        becomes    x -> ReduceSum(axes=[-1], keepdims=1) -> y

timm's ConViT normalizes its gated attention as ``attn / attn.sum(dim=-1).unsqueeze(-1)``, which both
exporters write as the pair (onnxoptimizer's fuse_consecutive_reduce_unsqueeze). Preconditions: the reduced
axes known (attribute or constant input, every axis when none are given and ``noop_with_empty_axes`` is 0),
the Unsqueeze's axes known and, read against the output rank, the same axes; the reduction's output read by the
Unsqueeze alone. The new reduction takes the Unsqueeze's output value. Exact (the same elements, in the same
order).
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import AXES_AS_INPUT_SINCE, axes_of
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

REDUCTIONS = tuple(op for op in AXES_AS_INPUT_SINCE if op.startswith("Reduce"))


def reduced_axes(node: Node, rank: int, opset: int) -> list[int] | None:
    """The axes a reduction removes, non-negative and sorted, or None when not known."""
    axes = axes_of(node, opset)
    takes_input = opset >= AXES_AS_INPUT_SINCE[node.op_type]
    if axes is None and takes_input and node.input(1) is not None:
        return None  # given at run time
    if not axes:
        return None if node.attr("noop_with_empty_axes", 0) else list(range(rank))
    if not all(-rank <= a < rank for a in axes):
        return None
    return sorted({a % rank for a in axes})


class ReduceUnsqueeze(Rule):
    name = "fuse_consecutive_reduce_unsqueeze"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        reduced = p.op(REDUCTIONS, p.var("x"), key="reduce", out="r")
        p.Unsqueeze(reduced, key="unsqueeze", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str | None:
        reduce, unsqueeze, rank = match.node("reduce"), match.node("unsqueeze"), match.value("x").rank
        if reduce.attr("keepdims", 1):
            return None  # nothing dropped, so nothing to put back
        if rank is None:
            return "the rank of its input is not known"
        removed = reduced_axes(reduce, rank, ctx.opset())
        inserted = axes_of(unsqueeze, ctx.opset())
        if removed is None or inserted is None:
            return "the axes of the reduction or of the Unsqueeze are not known"
        if sorted({a % rank for a in inserted}) != removed or len(inserted) != len(removed):
            return "the Unsqueeze puts back other axes than the reduction removed"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        reduce = match.node("reduce")
        attributes = {**reduce.attributes, "keepdims": 1}
        return match.graph.add_node(reduce.op_type, list(reduce.inputs), [match.value("y")], name=reduce.name,
                                    attributes=attributes, before=reduce)


@register_pass(name="fuse_consecutive_reduce_unsqueeze", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="a reduction dropping its axes, then an Unsqueeze of the same axes, keeps them")
def fuse_consecutive_reduce_unsqueeze(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ReduceUnsqueeze()])
