"""Comparing shapes that may hold symbolic or unknown dims: equal only when known to be equal; index tensors
that list every position of a shape in order; a Reshape that rewrites such an op."""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Graph, Node, Value


def same_dim(a, b) -> bool:
    """Two dims known to be equal: the same int, or the same symbolic name (never two unknowns)."""
    return a is not None and a == b


def same_shape(a, b) -> bool:
    """Two shapes known to be equal, dim by dim (unknown rank or unknown dims are never equal)."""
    return a is not None and b is not None and len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def static_shape(value: Value) -> tuple[int, ...] | None:
    shape = value.shape
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def lists_every_position(indices: np.ndarray, dims) -> bool:
    """``indices`` (..., k) list every k-tuple of positions of ``dims`` (its first k) once, in row-major order
    (negative ones counted from the end): a GatherND that reads, or a ScatterND that writes, each in turn."""
    k = indices.shape[-1] if indices.ndim else 0
    if k < 1 or k > len(dims):
        return False
    rows = indices.reshape(-1, k)
    rows = np.where(rows < 0, rows + np.array(dims[:k]), rows)
    grid = np.indices(dims[:k]).reshape(k, -1).T
    return rows.shape == grid.shape and bool(np.array_equal(rows, grid))


def reshape_instead(node: Node, graph: Graph, source: Value, output: Value, shape) -> Node:
    """A Reshape of ``source`` to the constant ``shape`` writing ``output``, in ``node``'s place and name: the
    rewrite of an op that only lists its input's elements in row-major order."""
    target = graph.root.add_initializer(f"{node.name}_shape", np.array(list(shape), dtype=np.int64))
    return graph.add_node("Reshape", [source, target], [output], name=node.name, before=node)
