"""fuse_consecutive_transposes: two Transposes in a row become one (or none, when they cancel).

    x -> Transpose(p1) -> t -> Transpose(p2) -> y    becomes    x -> Transpose(p1[p2]) -> y
                                                       or           x    (when p1[p2] is the identity)

Output axis i of the second reads axis p2[i] of ``t``, which is axis p1[p2[i]] of ``x``. The second
Transpose is changed in place to read ``x``; the first goes away once nothing else reads it. Exact.

A Squeeze or Unsqueeze between the two only drops or inserts unit axes, which a permutation carries along, so
the first Transpose moves past it and the pair composes as above (TorchScript's mobile multi-query attention
in timm's MobileNetV4 writes k as Transpose(0, 2, 1) -> Unsqueeze(1) -> Transpose(0, 1, 3, 2), which is
Unsqueeze(1) alone):

    x -> Transpose(p1) -> Unsqueeze(a) -> Transpose(p2) -> y    becomes    x -> Unsqueeze(a) -> Transpose(p) -> y
    x -> Transpose(p1) -> Squeeze(a) -> Transpose(p2) -> y      becomes    x -> Squeeze(p1[a]) -> Transpose(p) -> y

An Unsqueeze keeps its axes (they are positions of the output, where the Transpose now comes after it); a
Squeeze removes the axes of ``x`` the first Transpose moved to ``a``. The middle op must be read by the second
Transpose alone, and its axes known. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.eliminate.fuse_consecutive_squeezes import SQUEEZES, normalized_axes, set_axes
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


def moved_past(op_type: str, p1: list[int], axes: list[int]) -> tuple[list[int], list[int]]:
    """(axes, perm) with ``op(Transpose(x, p1), axes) == Transpose(op(x, axes'), perm)`` for ``op`` a Squeeze or
    an Unsqueeze of ``axes`` (non-negative, sorted)."""
    if op_type == "Unsqueeze":
        rank = len(p1) + len(axes)
        kept = [i for i in range(rank) if i not in axes]  # output positions of the permuted axes, in order
        perm = list(range(rank))
        for i, source in enumerate(p1):
            perm[kept[i]] = kept[source]
        return axes, perm
    removed = sorted(p1[a] for a in axes)  # the axes of x the Squeeze removes
    remaining = [d for d in range(len(p1)) if d not in removed]  # x's axes after the Squeeze, in order
    return removed, [remaining.index(p1[i]) for i in range(len(p1)) if i not in axes]


class TransposesAroundSqueeze(Rule):
    name = "fuse_consecutive_transposes"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name + "_around_squeeze")
        t = p.Transpose(p.var("x"), key="first", out="t").keep()
        s = p.op(SQUEEZES, t, key="middle", out="s")
        p.Transpose(s, key="second")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple[list[int], list[int]] | str:
        first, middle, second = match.node("first"), match.node("middle"), match.node("second")
        p1, p2 = permutation(first), permutation(second)
        axes = normalized_axes(middle, ctx.opset())
        if p1 is None or p2 is None or axes is None:
            return f"the permutations or the axes of its {middle.op_type} are not known"
        moved_axes, perm = moved_past(middle.op_type, p1, axes)
        if len(perm) != len(p2):
            return "the permutations are not known"
        return moved_axes, [perm[axis] for axis in p2]

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple[list[int], list[int]]) -> Node:
        moved_axes, composed = plan
        middle, second, x = match.node("middle"), match.node("second"), match.value("x")
        moved = match.graph.add_node(middle.op_type, [x], [f"{middle.outputs[0].name}_moved"],
                                     name=f"{middle.name}_moved", before=middle)
        shape = None if x.shape is None else list(x.shape)
        if shape is not None and middle.op_type == "Unsqueeze":
            for axis in moved_axes:
                shape.insert(axis, 1)
        elif shape is not None:
            shape = [d for i, d in enumerate(shape) if i not in moved_axes]
        moved.outputs[0].dtype, moved.outputs[0].shape = x.dtype, None if shape is None else tuple(shape)
        set_axes(match.graph, moved, moved_axes, ctx.opset())
        second.set_input(0, moved.outputs[0])
        second.set_attr("perm", composed)
        return moved


@register_pass(name="fuse_consecutive_transposes", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="compose two consecutive Transposes into one, or none when they cancel, also across "
                           "a Squeeze or Unsqueeze")
def fuse_consecutive_transposes(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConsecutiveTransposes(), TransposesAroundSqueeze()])
