"""New constants for rewrites: an initializer from an array, a node output replaced by one, a body's initializer
moved to the main graph."""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Graph, Value


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
