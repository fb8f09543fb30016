"""New constants for rewrites: an initializer from an array, a node output replaced by one, a body's initializer
moved to the main graph."""
from __future__ import annotations

import numpy as np

from worker.engine.evaluate import NONDETERMINISTIC
from worker.engine.ir import Graph, Node, Value


def add_constant(graph: Graph, base: str, array: np.ndarray) -> Value:
    """A new initializer in ``graph`` (fresh name), typed from the array."""
    return graph.add_initializer(base, np.asarray(array))


def replace_with_constant(graph: Graph, value: Value, array: np.ndarray) -> Value:
    """Readers of ``value`` (a node output of ``graph``) read a new initializer of the main graph that takes
    its name; ``value`` steps aside under a fresh name, for its producer to be removed next.

    The output is renamed rather than the initializer, which keeps this O(1) per value.
    """
    name = value.name
    graph.rename_fresh(value, name + "_replaced")
    initializer = graph.root.add_initializer(name, np.asarray(array), exact_name=True)
    graph.replace_all_uses(value, initializer)
    return initializer


def hoist_initializer(value: Value, root: Graph) -> Value:
    """Move an initializer of a body into ``root`` under the same name, uses kept."""
    home = value.graph
    if home is root:
        return value
    data = value.const_source or value.const
    moved = root.add_initializer(value.name + "_hoisted", data)
    home.replace_all_uses(value, moved)
    name = value.name
    home.remove_initializer(value)
    root.rename_value(moved, name)
    return moved


#: How many producers computed_from_constants looks at before it answers no.
WALK_LIMIT = 512


def computed_from_constants(nodes: "list[Node]") -> bool:
    """Whether every value ``nodes`` read from outside themselves is a constant or computed by deterministic
    standard ops from constants alone, so that constant folding computes the nodes (DETR's first decoder layer
    attends over its constant object queries). A fusion into an op of another domain, which folding leaves
    alone, would keep such a chain to run at every inference."""
    inside = {id(node) for node in nodes}
    stack = [v for node in nodes for v in node.inputs if v is not None and id(v.producer) not in inside]
    seen: set[int] = set()
    while stack:
        value = stack.pop()
        if id(value) in seen or value.is_constant:
            continue
        seen.add(id(value))
        producer = value.producer
        if producer is None or producer.domain or producer.op_type in NONDETERMINISTIC or producer.subgraphs() \
                or len(seen) > WALK_LIMIT:
            return False
        stack.extend(v for v in producer.inputs if v is not None)
    return True

