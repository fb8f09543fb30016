"""eliminate_nop_split: a Split with one output is removed; a Split with one used output becomes a Slice.

    x -> Split -> y                  becomes    x
    x -> Split -> (a unused, b, c unused)    becomes    x -> Slice(start=len(a), end=len(a)+len(b)) -> b

(ncnn's eliminate_split and "split with one used output".) The Slice computes only the part that is read.
Its bounds come from the static sizes of the outputs along the axis; starts/ends are attributes of Slice
before opset 10 and constant inputs from it on. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.ir import Graph, Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import add_constant
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules, is_attached
from worker.passes.registry import register_pass


class SingleSplitRule(ForwardRule):
    name = "eliminate_nop_split"
    op_types = ("Split",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        return node.input(0) if len(node.outputs) == 1 else None


def slice_bounds(node: Node, used: int) -> tuple[int, int, int] | str:
    """(axis, start, end) of output ``used`` along the split axis, from the static output sizes."""
    source = node.input(0)
    if source.rank is None:
        return "the rank of its input is not known"
    axis = node.attr("axis", 0) % source.rank
    sizes = []
    for value in node.outputs[:used + 1]:
        if value.shape is None or not isinstance(value.shape[axis], int):
            return "the sizes of its outputs along the axis are not known"
        sizes.append(value.shape[axis])
    start = sum(sizes[:-1])
    return axis, start, start + sizes[-1]


def split_to_slice(ctx: PassContext, graph: Graph, node: Node, result: PassResult) -> None:
    used = [i for i, v in enumerate(node.outputs) if v.is_used]
    if len(node.outputs) < 2 or len(used) != 1:
        return
    bounds = slice_bounds(node, used[0])
    if isinstance(bounds, str):
        result.refused(f"split_to_slice: {bounds}")
        return
    axis, start, end = bounds
    source, out = node.input(0), node.outputs[used[0]]
    if ctx.opset() >= 10:
        inputs = [source] + [add_constant(graph.root, f"{node.name}_{what}", np.array([n], dtype=np.int64))
                             for what, n in (("starts", start), ("ends", end), ("axes", axis))]
        slice_node = graph.add_node("Slice", inputs, [out], name=f"{node.name}_slice", before=node)
    else:
        slice_node = graph.add_node("Slice", [source], [out], name=f"{node.name}_slice", before=node,
                                    attributes={"starts": [start], "ends": [end], "axes": [axis]})
    graph.remove_node(node)
    result.rewrote({"rule": "split_to_slice", "from": [node.name], "to": [slice_node.name]})


@register_pass(name="eliminate_nop_split", kind=PassKind.PROGRAM, level=1,
               description="remove single-output Split; a Split with one used output becomes a Slice")
def eliminate_nop_split(ctx: PassContext) -> PassResult:
    result = apply_forward_rules(ctx, [SingleSplitRule()])
    for graph in list(ctx.graph.all_graphs()):
        for node in graph.nodes_of_type("Split"):
            if node.graph is graph and is_attached(graph, ctx.graph):
                split_to_slice(ctx, graph, node, result)
    return result
