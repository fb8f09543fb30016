"""fuse_consecutive_concats: a Concat that reads another Concat along the same axis takes its inputs instead
(onnxoptimizer's fuse_consecutive_concats; onnxsim and onnxslim do the same).

    Concat(a, Concat(b, c, axis=1), d, axis=1) -> y    becomes    Concat(a, b, c, d, axis=1) -> y

Inception-style blocks and exporters that concatenate in stages write such chains. Every inner Concat on the
same axis is inlined at once, in place of each of its reads; an inner Concat that something else reads stays
for it. Axes are compared normalized (a negative axis needs the rank). Exact: the output holds the same
elements in the same order.
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


def _axis(node: Node) -> int | None:
    """The node's axis, non-negative, or None when it is negative and the rank is not known."""
    axis = int(node.attr("axis", 0))
    if axis >= 0:
        return axis
    rank = node.output().rank
    return None if rank is None else axis % rank


def _inner(node: Node, value: Value | None) -> Node | None:
    """The Concat along ``node``'s axis that produces ``value``, or None."""
    producer = value.producer if value is not None else None
    if producer is None or producer.op_type != "Concat" or producer.domain or producer is node:
        return None
    own = _axis(node)
    return producer if own is not None and _axis(producer) == own else None


def reads_a_concat(node: Node) -> bool:
    """one of its inputs is a Concat along the same axis"""
    return any(_inner(node, value) is not None for value in node.inputs)


class ConsecutiveConcats(Rule):
    name = "fuse_consecutive_concats"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op("Concat", key="outer", out="y", when=reads_a_concat)
        return p

    def check(self, ctx: PassContext, match: Match) -> list[Value] | str:
        """The outer Concat's inputs with every inner Concat's inputs in its place."""
        outer, inputs = match.node("outer"), []
        for value in outer.inputs:
            inner = _inner(outer, value)
            inputs += list(inner.inputs) if inner is not None else [value]
        if any(value is None for value in inputs):
            return f"{describe(outer)} reads an absent input"
        return inputs

    def rewrite(self, ctx: PassContext, match: Match, inputs: list[Value]) -> Node:
        outer, graph = match.node("outer"), match.graph
        return graph.add_node("Concat", inputs, outputs=[match.value("y")], name=outer.name,
                              attributes={"axis": int(outer.attr("axis", 0))}, before=outer)


@register_pass(name="fuse_consecutive_concats", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="inline a Concat's inputs into the Concat along the same axis that reads it")
def fuse_consecutive_concats(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConsecutiveConcats()])
