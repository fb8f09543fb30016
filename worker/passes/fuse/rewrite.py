"""What the fusion and replacement rules share: refusal sentences about weights, building the fused node,
and removing the constants (and Constant nodes) a fusion left without a use.

A fusion builds new weight arrays, so the old ones usually lose their last use; the matcher removes the
pattern's ops, and ``run_rules`` then removes what those ops were the last to read. The cleanup passes do the
same for the whole graph, but each fusion must leave a clean graph on its own.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from worker.ir import Graph, Node, Value
from worker.passes.base import PassContext, PassResult
from worker.passes.fuse.weights import cast_like
from worker.pattern import Match, Rule, apply_rules


class FusionRule(Rule):
    """A rule that records the values its rewrites may orphan; ``run_rules`` removes them afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.orphans: list[Value] = []

    def orphan(self, *values: Value | None) -> None:
        self.orphans.extend(v for v in values if v is not None)


def run_rules(ctx: PassContext, rules: Sequence[Rule]) -> PassResult:
    """Apply the rules to every graph (bodies included), then remove what the rewrites left unused."""
    result = apply_rules(ctx, rules)
    for rule in rules:
        if isinstance(rule, FusionRule):
            remove_unused(rule.orphans)
            rule.orphans.clear()
    return result


def remove_unused(values: Iterable[Value]) -> None:
    """Remove each value nobody uses any more: an initializer, or a node all of whose outputs are unused
    (then, in turn, that node's inputs). Graph inputs and outputs are never touched."""
    pending = list(values)
    while pending:
        value = pending.pop()
        if value.is_used or value.graph is None or value.is_graph_input:
            continue
        if value.is_initializer:
            value.graph.remove_initializer(value)
            continue
        node = value.producer
        if node is None or node.graph is None or any(out.is_used for out in node.outputs):
            continue
        inputs = [v for v in node.inputs if v is not None]
        node.graph.remove_node(node)
        pending.extend(inputs)


def fused_name(base: str) -> str:
    """``base`` + "_fused", without piling suffixes up when a weight is fused again."""
    return re.sub(r"(_fused)?(__\d+)?$", "", base, count=1) + "_fused"


def graph_of(match: Match) -> Graph:
    return match.nodes[0].graph


def describe(node: Node) -> str:
    return f"{node.op_type} {node.name!r}"


def constant_refusal(node: Node, slot: int, what: str) -> str | None:
    """Why input ``slot`` of ``node`` cannot be folded into: absent, quantized, not constant, not float."""
    value = node.input(slot)
    if value is None:
        return f"{describe(node)} has no {what}"
    producer = value.producer
    if producer is not None and producer.op_type == "DequantizeLinear":
        return (f"the {what} of {describe(node)} are quantized (they come from DequantizeLinear "
                f"{producer.name!r}), and folding into them would change the quantized values")
    data = value.constant_value()
    if data is None:
        return f"the {what} of {describe(node)} ({value.name!r}) are not constants"
    if data.dtype not in (np.float16, np.float32, np.float64):
        return f"the {what} of {describe(node)} are {data.dtype}, and only float weights are folded"
    return None


def conv_refusal(conv: Node) -> str | None:
    """Why a Conv/ConvTranspose's weights and bias cannot absorb a per-channel factor."""
    refusal = constant_refusal(conv, 1, "weights") or (
        constant_refusal(conv, 2, "bias") if conv.input(2) is not None else None)
    if refusal:
        return refusal
    weight, group = conv.input(1).constant_value(), conv.attr("group", 1)
    if weight.ndim < 3 or group < 1 or weight.shape[0] % group:
        return f"the weights of {describe(conv)} have shape {list(weight.shape)}, which does not fit group={group}"
    return None


def conv_bias(conv: Node, channels: int) -> np.ndarray:
    """The conv's bias as float64, zeros when it has none."""
    value = conv.input(2)
    if value is None:
        return np.zeros(channels)
    return np.asarray(value.constant_value(), dtype=np.float64)


def fused_conv(graph: Graph, conv: Node, weight: np.ndarray | None, bias: np.ndarray, output: Value, *,
               before: Node) -> Node:
    """A copy of ``conv`` producing ``output`` with a new bias and new weights (None: its own weights), cast
    to the old weights' type, placed before ``before``."""
    old_weight = conv.input(1)
    like = old_weight.constant_value()
    new_weight = old_weight if weight is None else \
        graph.add_initializer(fused_name(old_weight.name), cast_like(weight, like))
    bias_name = conv.input(2).name if conv.input(2) is not None else f"{conv.name}_bias"
    new_bias = graph.add_initializer(fused_name(bias_name), cast_like(bias, like))
    return graph.add_node(conv.op_type, [conv.input(0), new_weight, new_bias], outputs=[output],
                          name=conv.name, attributes=dict(conv.attributes), before=before)


def new_value(graph: Graph, base: str, like: Value, shape=None) -> Value:
    """A fresh value typed like ``like`` (or with ``shape``), to pass as a new node's output."""
    return graph.make_value(base, like.dtype, like.shape if shape is None else tuple(shape))
