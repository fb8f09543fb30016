"""reduction_global_pool_replace: a mean (or max) over all spatial dims becomes global pooling (ncnn's
replace_reduction_with_global_pooling).

    ReduceMean(x, axes=[2, 3], keepdims=1)                          ->  GlobalAveragePool(x)
    ReduceMean(x, axes=[2, 3], keepdims=0)                          ->  Flatten(GlobalAveragePool(x), axis=1)
    ReduceMean(ReduceMean(x, axes=[2], keepdims=1), axes=[3], ...)  ->  GlobalAveragePool(x)   (H then W, or W then H)
    ReduceMax likewise                                               ->  GlobalMaxPool(x)

Any rank >= 3 works (the spatial dims are 2..rank-1); axes come from the attribute or, from opset 18 (13 for
ReduceSum, not used here), from the constant input. keepdims=0 drops the pooled 1x1 dims with a Flatten (ncnn's
global pooling writes a flat blob, the same [N, C]); a view, checked only not to land on the host where the
reduction had a listed place (ARM runs views on Paddle-Lite's host kernels: one more host node). This form
is eliminate_flatten_after_global_pooling's input, so it is made only where pooling gets a strictly better
place than the reduction (placement_gain; that pass refuses exactly there), else the two would undo each other
until their fixed point gave up. It matters on places whose tables give pooling an NHWC or fp16 kernel and the
reduction none (ARM: ReduceMean fp32 NCHW only): the layout cast then converts the pooled [N, C, 1, 1] instead
of the whole feature map. keepdims=0 is refused in the two-reduction form (the second's axes would be
shifted). An input with a zero dim is refused: onnxruntime's global pooling fails on it, where the reduction
runs.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import axes_of
from worker.engine.passes.support.placement import (best_place, constant_facts, node_facts, node_opset,
                                                   placement_gain, placement_refusal, planned_facts)
from worker.engine.places import HOST
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

GLOBAL = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}


def drops_dims(node: Node) -> bool:
    return not node.attr("keepdims", 1)


def pooled_shape(x) -> tuple | None:
    """Global pooling's output: [N, C, 1, ...]."""
    return None if x.shape is None else tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2)


def reduced_axes(node, opset: int, rank: int) -> set[int] | None:
    axes = axes_of(node, opset)
    return None if axes is None else {a % rank for a in axes}


class _ReduceRule(Rule):
    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def reductions(self, match: Match) -> list[Node]:
        return match.nodes

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        rank = match.value("x").rank
        first = self.reductions(match)[0]
        if rank is None or rank < 3:
            return f"the input of {describe(first)} has unknown rank or no spatial dims"
        if 0 in (match.value("x").shape or ()):
            return f"the input of {describe(first)} is empty, and onnxruntime's global pooling refuses empty " \
                   f"tensors where the reduction gives an empty or NaN result"
        covered: list[int] = []
        for node in self.reductions(match):
            if not node.attr("keepdims", 1) and len(match.nodes) > 1:
                return f"{describe(node)} drops the reduced dims (keepdims=0) between two reductions"
            axes = reduced_axes(node, ctx.opset(), rank)
            if axes is None:
                given = node.input(1) is not None or node.has_attr("axes")
                return f"the axes of {describe(node)} are not constants" if given else \
                    f"{describe(node)} reduces every dim, not only the spatial ones"
            covered += sorted(axes)
        if sorted(covered) != list(range(2, rank)):
            return f"the reductions at {describe(first)} average dims {sorted(covered)}, not exactly the spatial dims"
        x = match.value("x")
        pooled = constant_facts(x.dtype, pooled_shape(x), constant=False) if drops_dims(first) else match.value("out")
        facts = planned_facts(GLOBAL[self.op], "", ctx.opset(""), [x], [pooled], {}, first.name)
        if drops_dims(first):  # the inverse of eliminate_flatten_after_global_pooling: only for a better place
            return placement_gain(ctx, facts, match.nodes) or self._flatten_refusal(ctx, match, x, first) or True
        return placement_refusal(ctx, facts, match.nodes) or True

    @staticmethod
    def _flatten_refusal(ctx: PassContext, match: Match, x, first: Node) -> str | None:
        """The Flatten the keepdims=0 form adds must not be a host node where the reduction had a listed place
        (ARM runs views on Paddle-Lite's host kernels): the pooling's better place would cost one."""
        pooled = constant_facts(x.dtype, pooled_shape(x), constant=False)
        flatten = best_place(ctx, planned_facts("Flatten", "", ctx.opset(""), [pooled], [match.value("out")],
                                                {"axis": 1}, f"{first.name}_flatten"))
        reduction = best_place(ctx, node_facts(first, node_opset(ctx.opset, first)))
        if flatten is not None and flatten[1].startswith(f"{HOST.name}/") and reduction is not None \
                and not reduction[1].startswith(f"{HOST.name}/"):
            return (f"the Flatten that drops {describe(first)}'s pooled dims would run on {flatten[1]}, where "
                    f"the reduction runs on {reduction[1]}")
        return None

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node | list[Node]:
        last, x, out, graph = self.reductions(match)[-1], match.value("x"), match.value("out"), match.graph
        if not drops_dims(last):
            return graph.add_node(GLOBAL[self.op], [x], outputs=[out], name=last.name, before=last)
        pooled = graph.make_value(f"{out.name}_pooled", x.dtype, pooled_shape(x))
        pool = graph.add_node(GLOBAL[self.op], [x], outputs=[pooled], name=last.name, before=last)
        return [pool, graph.add_node("Flatten", [pooled], outputs=[out], name=f"{last.name}_flatten",
                                     attributes={"axis": 1}, before=last)]


class OneReduction(_ReduceRule):
    pattern_args = ("op",)

    def __init__(self, op: str):
        super().__init__(op)
        self.name = f"{op.lower()}_spatial"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(self.op, p.var("x"), key="reduce", out="out")
        return p


class TwoReductions(_ReduceRule):
    pattern_args = ("op",)

    def __init__(self, op: str):
        super().__init__(op)
        self.name = f"{op.lower()}_twice"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        mid = p.op(self.op, p.var("x"), key="first")
        p.op(self.op, mid, key="second", out="out")
        return p

    def reductions(self, match: Match) -> list[Node]:
        return [match.node("first"), match.node("second")]


@register_pass(name="reduction_global_pool_replace", peer="ncnn", kind=PassKind.PROGRAM, level=2,
               description="replace ReduceMean/ReduceMax over all spatial dims (at once or H then W) by "
                           "global pooling (and a Flatten where the reduction drops the dims)")
def reduction_global_pool_replace(ctx: PassContext) -> PassResult:
    rules = [TwoReductions(op) for op in GLOBAL] + [OneReduction(op) for op in GLOBAL]
    return apply_rules(ctx, rules)
