"""Structural checks of the IR: single assignment, exact use lists, index, names and order.

Tests run it after every pass (as a manager instrument), so a pass that leaves the graph inconsistent fails
right where it did so, not three passes later.
"""
from __future__ import annotations

from worker.engine.ir.graph import Graph
from worker.engine.ir.value import Use


class IRError(AssertionError):
    pass


def verify_graph(graph: Graph, *, require_sorted: bool = True) -> None:
    """Raise IRError describing the first inconsistency found in ``graph`` or its bodies."""
    for body in graph.all_graphs():
        _verify_one(body, require_sorted)


def _verify_one(graph: Graph, require_sorted: bool) -> None:
    count = 0
    seen_names: set[str] = set()
    for node in graph:
        count += 1
        if node.graph is not graph:
            raise IRError(f"{node!r} is listed in {graph!r} but says it belongs to {node.graph!r}")
        if node not in graph._index.get((node.domain, node.op_type), {}):
            raise IRError(f"{node!r} is missing from the op-type index")
        if node.name in seen_names:
            raise IRError(f"node name {node.name!r} is used twice")
        seen_names.add(node.name)
        for slot, value in enumerate(node.inputs):
            if value is None:
                continue
            if graph.lookup(value.name) is not value:
                raise IRError(f"{node!r} reads {value.name!r}, which is not visible from {graph!r}")
            if Use(node, slot) not in value.uses:
                raise IRError(f"{value!r} does not record its use by {node!r} at slot {slot}")
        for slot, value in enumerate(node.outputs):
            if value.producer is not node or value.producer_slot != slot:
                raise IRError(f"{value!r} does not name {node!r} slot {slot} as its producer")
            if graph.value(value.name) is not value:
                raise IRError(f"output {value.name!r} of {node!r} is not registered in its graph")
    if count != len(graph):
        raise IRError(f"{graph!r} counts {len(graph)} nodes but lists {count}")
    holders = {node for node in graph if node.subgraphs()}
    if holders != set(graph._holders):
        raise IRError(f"{graph!r} records {len(graph._holders)} nodes holding bodies, but {len(holders)} do")
    indexed = sum(len(nodes) for nodes in graph._index.values())
    if indexed != count:
        raise IRError(f"the op-type index holds {indexed} nodes, the graph {count}")
    for value in graph.values():
        for use in value.uses:
            if use.node.graph is None or use.node.input(use.slot) is not value:
                raise IRError(f"{value!r} lists a stale use by {use.node!r} at slot {use.slot}")
        if value.producer is None and not (value.is_graph_input or value.is_initializer):
            raise IRError(f"{value!r} has no producer and is neither an input nor an initializer")
    outputs = {}
    for value in graph.outputs:
        outputs[id(value)] = outputs.get(id(value), 0) + 1
        if graph.lookup(value.name) is not value:
            raise IRError(f"graph output {value.name!r} is not visible from {graph!r}")
    for value in graph.outputs:
        if value._output_count < outputs[id(value)]:
            raise IRError(f"graph output {value.name!r} does not know it is an output")
    if require_sorted and not graph.is_sorted():
        raise IRError(f"{graph!r} is not in topological order")


class VerifyInstrument:
    """A PassManager instrument that verifies the IR after every pass."""

    def before_pass(self, ctx, pass_) -> None:
        pass

    def after_pass(self, ctx, pass_, entry) -> None:
        try:
            verify_graph(ctx.graph)
        except IRError as exc:
            raise IRError(f"after pass {pass_.name!r}: {exc}") from None
