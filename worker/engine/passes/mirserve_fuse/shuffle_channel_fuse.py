"""shuffle_channel_fuse: the Reshape-Transpose-Reshape that ShuffleNet exporters write for a channel shuffle
becomes one mirserve.ChannelShuffle (Paddle-Lite's shuffle_channel_fuse_pass).

    Reshape(X [N, C, *S] -> [N, g, C/g, *T]) -> Transpose(perm 0, 2, 1, 3, ...) -> Reshape(-> [N, C, *S])
        =>  mirserve.ChannelShuffle(X, group=g)

Preconditions, read from the inferred shapes: the first Reshape splits exactly the channel axis into
(g, C/g) and keeps the batch and the trailing elements (T and S hold as many elements, in order); the
Transpose swaps only the two group axes; the last Reshape gives back X's shape; 1 < g < C (otherwise the
order does not change); only the pattern reads the two intermediates. Numeric effect: none (a permutation).
"""
from __future__ import annotations

import math

from worker.engine.mirserve_domain.ops import DOMAIN, VERSION
from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.mirserve_ops import emit_refusal
from worker.engine.passes.support.placement import placement_refusal, planned_facts
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


def _same_dim(a, b) -> bool:
    return a is not None and a == b


def _elements(dims) -> int | None:
    return math.prod(dims) if all(isinstance(d, int) for d in dims) else None


def shuffle_groups(x: Value, split: Value, perm, merged: Value) -> int | str:
    """The group count when the three shapes and the permutation describe a channel shuffle, else why not."""
    source, middle, target = x.shape, split.shape, merged.shape
    if source is None or middle is None or target is None:
        return "the shapes around it are not known"
    if len(source) < 2 or len(middle) < 3 or not isinstance(source[1], int):
        return f"reshaping {_show(source)} to {_show(middle)} does not split a static channel axis in two"
    batch, groups, per_group, rest = middle[0], middle[1], middle[2], middle[3:]
    if not (_same_dim(batch, source[0]) and isinstance(groups, int) and isinstance(per_group, int)
            and groups * per_group == source[1]):
        return f"reshaping {_show(source)} to {_show(middle)} does not split the channel axis into groups"
    if not (tuple(rest) == tuple(source[2:]) or _same_dim(_elements(rest), _elements(source[2:]))):
        return f"reshaping {_show(source)} to {_show(middle)} does not keep the trailing elements"
    expected = [0, 2, 1, *range(3, len(middle))]
    if list(perm or []) != expected:
        return f"the transpose permutation {list(perm or [])} does not swap just the two group axes"
    if tuple(target) != tuple(source) or any(d is None for d in target):
        return f"the last reshape gives {_show(target)}, not the input's shape {_show(source)}"
    if groups == 1 or per_group == 1:
        return f"with {groups} group(s) of {per_group} channel(s) the shuffle leaves every channel in place"
    return groups


def _show(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class ShuffleChannel(Rule):
    name = "ChannelShuffle"

    def build_pattern(self) -> Pattern:
        p = Pattern("shuffle_channel")
        split = p.Reshape(p.var("x"), p.var("split_shape"), key="split_reshape", out="split")
        swapped = p.Transpose(split, key="transpose")
        p.Reshape(swapped, p.var("merge_shape"), key="merge_reshape", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> int | str:
        """The group count, or why the three ops are no channel shuffle."""
        transpose: Node = match.node("transpose")
        groups = shuffle_groups(match.value("x"), match.value("split"), transpose.attr("perm"), match.value("y"))
        if isinstance(groups, str):
            return groups
        refusal = emit_refusal(ctx, self.name, match.value("x").dtype)
        if refusal:
            return refusal
        facts = planned_facts(self.name, DOMAIN, VERSION, [match.value("x")], [match.value("y")],
                              {"group": groups}, match.node("split_reshape").name)
        return placement_refusal(ctx, facts, match.nodes) or groups

    def rewrite(self, ctx: PassContext, match: Match, groups: int) -> Node:
        first = match.node("split_reshape")
        return match.graph.add_node("ChannelShuffle", [match.value("x")], [match.value("y")], domain=DOMAIN,
                                    attributes={"group": groups}, name=f"{first.name}_shuffle", before=first)


@register_pass(name="shuffle_channel_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Reshape + Transpose + Reshape that shuffle channels -> mirserve.ChannelShuffle")
def shuffle_channel_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ShuffleChannel()])
