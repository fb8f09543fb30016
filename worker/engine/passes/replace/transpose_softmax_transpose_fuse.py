"""transpose_softmax_transpose_fuse: Transpose -> Softmax -> inverse Transpose becomes one Softmax on the
axis the transposes moved (Paddle-Lite's transpose_softmax_transpose_fuse; LogSoftmax too).

    Transpose(Softmax(Transpose(x, perm), axis=a), inverse(perm))  ->  Softmax(x, axis=perm[a])

From opset 13 Softmax normalizes one axis. Before 13 it flattens the input to 2-D at its axis and normalizes
over every dim from the axis on, so the rewrite is exact only when perm keeps that trailing block of dims in
order (perm[a:] == [perm[a], ..., rank-1]); otherwise it is refused.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.placement import placement_refusal, planned_facts
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


def inverse(perm: list[int]) -> list[int]:
    result = [0] * len(perm)
    for i, p in enumerate(perm):
        result[p] = i
    return result


class TransposedSoftmax(Rule):
    name = "transpose_softmax_transpose"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.Transpose(p.var("x"), key="before")
        s = p.op(("Softmax", "LogSoftmax"), t, key="softmax")
        p.Transpose(s, key="after", out="out")
        return p

    def _new_axis(self, ctx: PassContext, match: Match) -> int | str:
        """The Softmax axis on x, or a refusal sentence."""
        before, after, softmax = match.node("before"), match.node("after"), match.node("softmax")
        rank = match.value("x").rank
        perm = before.attr("perm")
        if perm is None or rank is None:
            return f"the permutation of {describe(before)} or the rank of its input is unknown"
        perm = [int(p) for p in perm]
        if [int(p) for p in after.attr("perm", list(reversed(range(rank))))] != inverse(perm):
            return f"{describe(after)} does not undo {describe(before)}"
        opset = ctx.opset()
        axis = int(softmax.attr("axis", -1 if opset >= 13 else 1)) % rank
        if opset < 13 and perm[axis:] != list(range(perm[axis], rank)):
            return (f"before opset 13 {describe(softmax)} normalizes dims {axis}.. together, which the "
                    f"transposes scatter over x")
        return perm[axis]

    def check(self, ctx: PassContext, match: Match) -> int | str:
        axis = self._new_axis(ctx, match)
        if isinstance(axis, str):
            return axis
        softmax = match.node("softmax")
        facts = planned_facts(softmax.op_type, "", ctx.opset(""), [match.value("x")], [match.value("out")],
                              {"axis": axis}, softmax.name)
        return placement_refusal(ctx, facts, match.nodes) or axis

    def rewrite(self, ctx: PassContext, match: Match, axis: int) -> Node:
        softmax = match.node("softmax")
        return match.graph.add_node(softmax.op_type, [match.value("x")], outputs=[match.value("out")],
                                    name=softmax.name, attributes={"axis": axis}, before=match.node("after"))


@register_pass(name="transpose_softmax_transpose_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=2,
               description="replace Transpose -> Softmax -> inverse Transpose by a Softmax on the right axis")
def transpose_softmax_transpose_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [TransposedSoftmax()])
