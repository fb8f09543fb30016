"""eliminate_common_subexpression: a node that repeats an earlier node (same op, attributes and inputs) is
removed, and its readers read the earlier node's outputs.

    a = Relu(x); b = Relu(x); y = Add(a, b)    becomes    a = Relu(x); y = Add(a, a)

Only deterministic ops of the default domain without subgraphs; inputs are compared by identity (after
duplicate initializers are merged, equal weights are the same value). Refused when the repeated output is a
graph output and the earlier one is one too (one of the two names would be lost). Exact.
"""
from __future__ import annotations

from worker.engine.evaluate import NONDETERMINISTIC
from worker.engine.ir import Graph, Node
from worker.engine.ir.serde import encode_attribute
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass

#: Ops whose repeats are not the same computation (random draws; Dropout in training mode).
NOT_REPEATABLE = NONDETERMINISTIC | {"Dropout"}


def node_key(node: Node) -> tuple | None:
    """What makes two nodes compute the same thing; None for a node that must not be merged."""
    if node.domain or node.op_type in NOT_REPEATABLE or not node.outputs or node.subgraphs():
        return None
    attributes = tuple(sorted((name, encode_attribute(attr).SerializeToString())
                              for name, attr in node.attributes.items()))
    return (node.op_type, tuple(id(v) if v is not None else None for v in node.inputs), len(node.outputs),
            attributes)


def merge(graph: Graph, node: Node, earlier: Node) -> str | None:
    """Make readers of ``node`` read ``earlier`` and remove ``node``; why not, or None when done."""
    pairs = [(mine, theirs) for mine, theirs in zip(node.outputs, earlier.outputs) if mine.is_used]
    for mine, theirs in pairs:
        reason = graph.bypass_refusal(mine, theirs)
        if reason is not None:
            return reason
    for mine, theirs in pairs:
        graph.bypass(mine, theirs)
    graph.remove_node(node)
    return None


@register_pass(name="eliminate_common_subexpression", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove nodes that repeat an earlier node with the same op, attributes and inputs")
def eliminate_common_subexpression(ctx: PassContext) -> PassResult:
    result = PassResult()
    for graph in ctx.graph.live_graphs():
        seen: dict[tuple, Node] = {}
        for node in graph:
            key = node_key(node)
            if key is None:
                continue
            earlier = seen.setdefault(key, node)
            if earlier is node:
                continue
            name = node.name
            reason = merge(graph, node, earlier)
            if reason is None:
                result.rewrote({"rule": "eliminate_common_subexpression", "from": [name], "to": [earlier.name]})
            else:
                result.refused(f"eliminate_common_subexpression: {reason}")
    return result
