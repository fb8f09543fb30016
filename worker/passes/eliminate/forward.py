"""Single-op eliminations: an op whose output is provably the same tensor as one of its inputs goes away.

    x -> Op -> y -> consumers    becomes    x -> consumers

A rule names its op types and decides, per node, which input to forward or why not (a sentence for the
trace). The forwarding itself is shared: every other output of the op must be unused, the kept value must
have the output's element type, and a graph output keeps its name and type (``Graph.bypass``), which is
refused when the forwarded value is itself a graph input or output or comes from an outer graph.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from worker.ir import Graph, Node, Value
from worker.passes.base import PassResult
from worker.passes.common import bypass_refusal

if TYPE_CHECKING:
    from worker.passes.base import PassContext


class ForwardRule:
    """Subclass: set ``name`` and ``op_types``, define ``forward``."""

    name = "forward"
    op_types: tuple[str, ...] = ()

    def forward(self, ctx: "PassContext", node: Node) -> Value | str | None:
        """The input whose tensor the node's first output equals, or a sentence saying why there is none.

        None when the node is not a candidate at all (nothing worth a line in the trace).
        """
        raise NotImplementedError


def is_attached(graph: Graph, root: Graph) -> bool:
    """``graph`` is ``root`` or a body still reachable from it (a rewrite may drop a body mid-pass)."""
    while graph is not root:
        holder = graph.parent
        if holder is None or holder.graph is None:
            return False
        graph = holder.graph
    return True


def apply_forward_rules(ctx: "PassContext", rules: Iterable[ForwardRule],
                        result: PassResult | None = None) -> PassResult:
    """Apply each rule to every node of its op types, in every graph, bodies included."""
    result = result or PassResult()
    rules = list(rules)
    for graph in list(ctx.graph.all_graphs()):
        for rule in rules:
            for op_type in rule.op_types:
                for node in graph.nodes_of_type(op_type):
                    if node.graph is graph and is_attached(graph, ctx.graph):
                        _try_forward(graph, node, rule, ctx, result)
    return result


def _try_forward(graph: Graph, node: Node, rule: ForwardRule, ctx: "PassContext", result: PassResult) -> None:
    outcome = rule.forward(ctx, node)
    if outcome is None:
        return
    reason = outcome if isinstance(outcome, str) else forward_refusal(node, outcome)
    if reason is not None:
        result.refused(f"{rule.name}: {reason}")
        return
    forward(graph, node, outcome)
    result.rewrote({"rule": rule.name, "from": [node.name], "to": []})


def forward_refusal(node: Node, kept: Value) -> str | None:
    """Why ``node`` cannot be replaced by its input ``kept``, or None."""
    out = node.output(0)
    for extra in node.outputs[1:]:
        if extra.is_used:
            return f"its output {extra.name!r} is used"
    if out.dtype and kept.dtype and out.dtype != kept.dtype:
        return f"{kept.name!r} has another element type than {out.name!r}"
    return bypass_refusal(out, kept)


def forward(graph: Graph, node: Node, kept: Value) -> None:
    """Make every reader of the node's first output read ``kept`` and remove the node (checked before)."""
    if not graph.bypass(node.output(0), kept):
        raise AssertionError(f"bypass of {node!r} refused after its check passed")
    graph.remove_node(node)
