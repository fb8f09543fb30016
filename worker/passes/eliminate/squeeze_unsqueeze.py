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

from worker.ir import Graph, Node
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import add_constant, axes_of, remove_dead
from worker.passes.eliminate.forward import forward, forward_refusal, is_attached
from worker.passes.registry import register_pass

AXES_INPUT_SINCE = 13


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
        node.set_input(1, add_constant(graph.root, f"{node.name}_axes", np.array(axes, dtype=np.int64)))
    else:
        node.set_attr("axes", axes)


def fuse(graph: Graph, second: Node, opset: int, result: PassResult) -> None:
    first = second.input(0).producer
    labels = merged(first, second, opset)
    if isinstance(labels, str):
        result.refused(f"fuse_consecutive_squeezes: {labels}")
        return
    source, names = first.input(0), [first.name, second.name]
    rank = source.rank
    if cancels(labels, first, opset):
        reason = forward_refusal(second, source)
        if reason is not None:
            result.refused(f"fuse_consecutive_squeezes: {reason}")
            return
        forward(graph, second, source)
    elif first.op_type == second.op_type == "Unsqueeze":
        set_axes(graph, second, [i for i, label in enumerate(labels) if label == "new"], opset)
        second.set_input(0, source)
    elif first.op_type == second.op_type == "Squeeze":
        set_axes(graph, second, sorted(set(range(rank)) - set(labels)), opset)
        second.set_input(0, source)
    else:
        return  # a Squeeze and an Unsqueeze that do not cancel: nothing to gain
    remove_dead(first.graph, first)
    result.rewrote({"rule": "fuse_consecutive_squeezes", "from": names,
                    "to": [n.name for n in (first, second) if n.graph is not None]})


@register_pass(name="fuse_consecutive_squeezes", kind=PassKind.PROGRAM, level=1,
               description="remove Squeeze/Unsqueeze pairs that cancel; merge consecutive Squeezes or "
                           "Unsqueezes")
def fuse_consecutive_squeezes(ctx: PassContext) -> PassResult:
    result = PassResult()
    opset = ctx.opset()
    for graph in list(ctx.graph.all_graphs()):
        candidates = graph.nodes_of_type("Squeeze") + graph.nodes_of_type("Unsqueeze")
        for node in sorted(candidates, key=lambda n: n.position):
            producer = node.input(0).producer if node.input(0) is not None else None
            if node.graph is graph and producer is not None and producer.op_type in ("Squeeze", "Unsqueeze") \
                    and not producer.domain and is_attached(graph, ctx.graph):
                fuse(graph, node, opset, result)
    return result
