"""From the IR to liveness input: the final execution order as steps, and per value its size, space and role.

This is the only module of worker/engine/memory that reads the IR. The order is the graph's node order (the pass
manager keeps it topological); a value's memory space is that of its place's target (host, x86 and arm share
"host"), falling back to its producer's place, then to host.

Values known at optimization time (initializers, Constant outputs, and whatever is computed from those
alone, such as the ConstantOfShape weights of the light model-zoo models or an io_copy of a weight) are
weights: any runtime computes them once at load, so they are counted per space apart from the arena.
"""
from __future__ import annotations

from typing import Mapping

from worker.engine.ir import Graph, Node, Value
from worker.engine.memory.liveness import Step, ValueFacts
from worker.engine.memory.sizing import Sizing, is_computed

#: Ops that give a different result on every run, so their output is never a load-time constant.
_RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                         "Multinomial", "Bernoulli"})


def value_space(value: Value) -> str:
    place = value.place
    if place is None and value.producer is not None:
        place = value.producer.place
    return place.target.memory_space if place is not None else "host"


def constant_values(graph: Graph, outer: frozenset[str] = frozenset()) -> set[str]:
    """Names of the values of ``graph`` known at optimization time (``outer``: those of enclosing graphs)."""
    known = set(outer)
    # Initializers that are also graph inputs (IR version < 4 had to list them so) count as weights too.
    known.update(graph.initializers)
    for node in graph:
        if node.domain == "" and node.op_type == "Constant":
            known.update(v.name for v in node.outputs)
            continue
        inputs = [v for v in node.inputs if v is not None]
        if inputs and not node.subgraphs() and node.op_type not in _RANDOM_OPS \
                and all(v.name in known for v in inputs):
            known.update(v.name for v in node.outputs)
    return known


def role_of(value: Value, constants: set[str]) -> str | None:
    """Why the arena does not own ``value``'s memory, or None for an intermediate it must place."""
    if value.is_graph_output:
        return "graph output"
    if value.is_graph_input and not value.is_initializer:
        return "graph input"
    if value.is_initializer:
        return "initializer"
    if value.name in constants:
        return "constant"
    return None


def graph_facts(graph: Graph, sizing: Sizing, constants: set[str]) -> dict[str, ValueFacts]:
    """Facts for every value the graph defines (inputs, initializers, node outputs)."""
    facts = {}
    for value in graph.values():
        if value.producer is not None and not is_computed(value):
            continue
        facts[value.name] = ValueFacts(value.name, sizing.nbytes(value), value.dtype or None,
                                       sizing.shape(value), value_space(value), role_of(value, constants))
    return facts


def graph_steps(graph: Graph, scratch: Mapping[str, Mapping[str, int]] = {},
                left_out: frozenset[str] = frozenset()) -> list[Step]:
    """One step per node, in order.

    ``scratch`` maps a node name to the bytes per space its bodies need; outputs named in ``left_out`` are
    not planned (see ``unread_unsized``).
    """
    return [Step(node.name, node.op_type,
                 tuple(v.name if v is not None else "" for v in node.inputs),
                 tuple(v.name if is_computed(v) and v.name not in left_out else "" for v in node.outputs),
                 node.domain, _outer_reads(node), scratch.get(node.name, {}))
            for node in graph]


def unread_unsized(graph: Graph, sizing: Sizing) -> list[Value]:
    """Outputs nobody reads whose size is unknown (an inference-mode Dropout mask, say).

    Planning them would need a guess and blocking the whole arena for a value no one reads would be worse:
    they are left out of the plan and listed as such.
    """
    return [v for node in graph for v in node.outputs
            if is_computed(v) and not v.is_used and sizing.nbytes(v) is None]


def _outer_reads(node: Node) -> tuple[str, ...]:
    """Values from outside a node's bodies that the bodies read: they stay live until the node runs."""
    bodies = node.subgraphs()
    if not bodies:
        return ()
    inside = {id(g) for body in bodies for g in body.all_graphs()}
    reads: dict[str, None] = {}
    for body in bodies:
        for graph in body.all_graphs():
            read = [v for inner in graph for v in inner.inputs if v is not None]
            for value in read + graph.outputs:
                if id(value.graph) not in inside:
                    reads[value.name] = None
    return tuple(reads)
