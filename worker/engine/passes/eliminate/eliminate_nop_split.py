"""eliminate_nop_split: a Split with one output is removed; a Split with one used output becomes a Slice.

    x -> Split -> y                  becomes    x
    x -> Split -> (a unused, b, c unused)    becomes    x -> Slice(start=len(a), end=len(a)+len(b)) -> b

(ncnn's eliminate_split and "split with one used output".) The Slice computes only the part that is read.
Its bounds come from the static sizes of the outputs along the axis; starts/ends are attributes of Slice
before opset 10 and constant inputs from it on. Exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


def has_one_output(node: Node) -> bool:
    """has one output"""
    return len(node.outputs) == 1


def has_several_outputs(node: Node) -> bool:
    """has several outputs"""
    return len(node.outputs) > 1


class SingleSplitRule(Rule):
    name = "eliminate_nop_split"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Split(p.var("x"), when=has_one_output)
        return p

    def check(self, ctx: PassContext, match: Match) -> Value:
        return match.value("x")


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


@dataclass(frozen=True)
class SlicePlan:
    output: Value
    axis: int
    start: int
    end: int


class SplitToSliceRule(Rule):
    name = "split_to_slice"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Split(p.var("x"), key="split", outputs=0, when=has_several_outputs)
        return p

    def check(self, ctx: PassContext, match: Match) -> SlicePlan | str | None:
        node = match.node("split")
        used = [i for i, v in enumerate(node.outputs) if v.is_used]
        if len(used) != 1:
            return None
        bounds = slice_bounds(node, used[0])
        return bounds if isinstance(bounds, str) else SlicePlan(node.outputs[used[0]], *bounds)

    def rewrite(self, ctx: PassContext, match: Match, plan: SlicePlan) -> Node:
        node, source, graph = match.node("split"), match.value("x"), match.graph
        if ctx.opset() >= 10:
            bounds = [graph.root.add_initializer(f"{node.name}_{what}", np.array([n], dtype=np.int64))
                      for what, n in (("starts", plan.start), ("ends", plan.end), ("axes", plan.axis))]
            return graph.add_node("Slice", [source, *bounds], [plan.output], name=f"{node.name}_slice", before=node)
        return graph.add_node("Slice", [source], [plan.output], name=f"{node.name}_slice", before=node,
                              attributes={"starts": [plan.start], "ends": [plan.end], "axes": [plan.axis]})


@register_pass(name="eliminate_nop_split", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove single-output Split; a Split with one used output becomes a Slice")
def eliminate_nop_split(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [SingleSplitRule(), SplitToSliceRule()])
