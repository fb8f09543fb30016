"""fuse_consecutive_transposes: two Transposes in a row become one (or none, when they cancel).

    x -> Transpose(p1) -> t -> Transpose(p2) -> y    becomes    x -> Transpose(p1[p2]) -> y
                                                       or           x    (when p1[p2] is the identity)

Output axis i of the second reads axis p2[i] of ``t``, which is axis p1[p2[i]] of ``x``. The second
Transpose is changed in place to read ``x``; the first goes away once nothing else reads it. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, forward_refusal


def permutation(node: Node) -> list[int] | None:
    perm = node.attr("perm")
    if perm is not None:
        return [int(p) for p in perm]
    rank = node.input(0).rank
    return None if rank is None else list(reversed(range(rank)))


class ConsecutiveTransposes(Rule):
    name = "fuse_consecutive_transposes"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.Transpose(p.var("x"), key="first", out="t").keep()
        p.Transpose(t, key="second")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | list[int] | str:
        p1, p2 = permutation(match.node("first")), permutation(match.node("second"))
        if p1 is None or p2 is None or len(p1) != len(p2):
            return "the permutations are not known"
        composed = [p1[axis] for axis in p2]
        if composed == list(range(len(composed))) and forward_refusal(match, match.value("x")) is None:
            return match.value("x")
        return composed

    def rewrite(self, ctx: PassContext, match: Match, composed: list[int]) -> None:
        second = match.node("second")
        second.set_input(0, match.value("x"))
        second.set_attr("perm", composed)


@register_pass(name="fuse_consecutive_transposes", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="compose two consecutive Transposes into one, or none when they cancel")
def fuse_consecutive_transposes(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConsecutiveTransposes()])
