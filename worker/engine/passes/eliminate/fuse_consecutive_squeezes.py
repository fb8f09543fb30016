"""fuse_consecutive_squeezes: Squeeze/Unsqueeze pairs that cancel are removed; two Squeezes (or two
Unsqueezes) in a row become one.

    x -> Unsqueeze([0]) -> Squeeze([0]) -> y          becomes    x
    x:[N,1,C] -> Squeeze([1]) -> Unsqueeze([1]) -> y  becomes    x
    x -> Unsqueeze([0]) -> Unsqueeze([2]) -> y        becomes    x -> Unsqueeze([0, 2]) -> y

Axes are an attribute before opset 13 and a constant input from it on; a Squeeze without axes needs the
static unit dims of its input. Merged axes are found by replaying both ops on a list of axis labels.
The second op is changed in place; the first goes away once nothing else reads it. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Graph, Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import axes_of
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

AXES_INPUT_SINCE = 13
SQUEEZES = ("Squeeze", "Unsqueeze")


def normalized_axes(node: Node, opset: int) -> list[int] | None:
    """Axes of a Squeeze/Unsqueeze, non-negative, or None when not known."""
    source = node.input(0)
    axes = axes_of(node, opset)
    if axes is None and opset >= AXES_INPUT_SINCE and node.input(1) is not None:
        return None  # axes given as an input known only at run time
    if node.op_type == "Squeeze":
        if source.rank is None:
            return None
        if axes is None:
            if source.shape is None or not all(isinstance(d, int) for d in source.shape):
                return None
            return [i for i, d in enumerate(source.shape) if d == 1]
        return sorted(a % source.rank for a in axes)
    if axes is None or source.rank is None:
        return None
    out_rank = source.rank + len(axes)
    return sorted(a % out_rank for a in axes)


def replay(rank: int, steps: list[tuple[str, list[int]]]) -> list:
    """Axis labels after applying Squeeze/Unsqueeze steps to ``rank`` labelled axes ('new' for inserted)."""
    labels: list = list(range(rank))
    for op_type, axes in steps:
        if op_type == "Squeeze":
            labels = [label for i, label in enumerate(labels) if i not in set(axes)]
        else:
            for axis in sorted(axes):
                labels.insert(axis, "new")
    return labels


def merged(first: Node, second: Node, opset: int) -> list | str:
    """The labels of the pair's output, or why they are not known."""
    a1, a2 = normalized_axes(first, opset), normalized_axes(second, opset)
    rank = first.input(0).rank
    if a1 is None or a2 is None or rank is None:
        return "their axes or the rank of the input are not known"
    return replay(rank, [(first.op_type, a1), (second.op_type, a2)])


def cancels(labels: list, first: Node, opset: int) -> bool:
    """The pair gives back its input: every original axis in place, and only unit axes removed or added."""
    rank = first.input(0).rank
    if labels == list(range(rank)):
        return True  # Unsqueeze, then Squeeze of exactly the new axes
    if first.op_type != "Squeeze":
        return False
    squeezed = normalized_axes(first, opset)
    added = [i for i, label in enumerate(labels) if label == "new"]
    return added == squeezed and [x for x in labels if x != "new"] == [i for i in range(rank) if i not in squeezed]


def set_axes(graph: Graph, node: Node, axes: list[int], opset: int) -> None:
    if opset >= AXES_INPUT_SINCE:
        node.set_input(1, graph.root.add_initializer(f"{node.name}_axes", np.array(axes, dtype=np.int64)))
    else:
        node.set_attr("axes", axes)


class ConsecutiveSqueezes(Rule):
    name = "fuse_consecutive_squeezes"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.op(SQUEEZES, p.var("x"), key="first", out="t").keep()
        p.op(SQUEEZES, t, key="second")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | list[int] | str | None:
        """The value the pair gives back when it cancels, else the merged axes of the second op."""
        first, second, opset = match.node("first"), match.node("second"), ctx.opset()
        labels = merged(first, second, opset)
        if isinstance(labels, str):
            return labels
        if cancels(labels, first, opset):
            return match.value("x")
        if first.op_type != second.op_type:
            return None  # a Squeeze and an Unsqueeze that do not cancel: nothing to gain
        if first.op_type == "Unsqueeze":
            return [i for i, label in enumerate(labels) if label == "new"]
        return sorted(set(range(first.input(0).rank)) - set(labels))

    def rewrite(self, ctx: PassContext, match: Match, axes: list[int]) -> None:
        second = match.node("second")
        set_axes(match.graph, second, axes, ctx.opset())
        second.set_input(0, match.value("x"))


@register_pass(name="fuse_consecutive_squeezes", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Squeeze/Unsqueeze pairs that cancel; merge consecutive Squeezes or "
                           "Unsqueezes")
def fuse_consecutive_squeezes(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConsecutiveSqueezes()])
