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

from worker.domain import DOMAIN
from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.domain.support import drop_unused_constants, emit_refusal
from worker.passes.registry import register_pass
from worker.pattern import Match, Pattern, Rule, apply_rules


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

    def __init__(self) -> None:
        super().__init__()
        self.shape_values: list[Value] = []

    def build_pattern(self) -> Pattern:
        p = Pattern("shuffle_channel")
        x, split, swapped, merged = p.var("x"), p.var("split").keep(), p.var("swapped").keep(), p.var("y")
        p.op("split_reshape", "Reshape", inputs=[x, p.var("split_shape")], outputs=[split])
        p.op("transpose", "Transpose", inputs=[split], outputs=[swapped])
        p.op("merge_reshape", "Reshape", inputs=[swapped, p.var("merge_shape")], outputs=[merged])
        return p

    def check(self, ctx: PassContext, match: Match) -> str | None:
        for key, reader in (("split", "transpose"), ("swapped", "merge_reshape")):
            value, inside = match.value(key), match.node(reader)
            if value.is_graph_output:
                return f"the intermediate {value.name!r} is also a graph output"
            outside = [use.node for use in value.uses if use.node is not inside]
            if outside:
                return f"the intermediate {value.name!r} is also read by {outside[0].op_type} {outside[0].name!r}"
        groups = self._groups(match)
        if isinstance(groups, str):
            return groups
        return emit_refusal(ctx, self.name, match.value("x").dtype)

    @staticmethod
    def _groups(match: Match) -> int | str:
        transpose: Node = match.node("transpose")
        return shuffle_groups(match.value("x"), match.value("split"), transpose.attr("perm"), match.value("y"))

    def rewrite(self, ctx: PassContext, match: Match) -> Node:
        first = match.node("split_reshape")
        self.shape_values += [match.value("split_shape"), match.value("merge_shape")]
        return first.graph.add_node("ChannelShuffle", [match.value("x")], [match.value("y")], domain=DOMAIN,
                                    attributes={"group": self._groups(match)}, name=f"{first.name}_shuffle",
                                    before=first)


@register_pass(name="shuffle_channel_fuse", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Reshape + Transpose + Reshape that shuffle channels -> mirserve.ChannelShuffle")
def shuffle_channel_fuse(ctx: PassContext) -> PassResult:
    rule = ShuffleChannel()
    result = apply_rules(ctx, [rule])
    drop_unused_constants(rule.shape_values)
    return result
