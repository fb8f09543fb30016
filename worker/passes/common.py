"""Small helpers that passes of every family need: opset-dependent inputs, constants, new initializers."""
from __future__ import annotations

import numpy as np

from worker.ir import Graph, Node, Value

#: Opset from which an op takes ``axes`` as an input instead of an attribute.
AXES_AS_INPUT_SINCE = {"Squeeze": 13, "Unsqueeze": 13, "ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18,
                       "ReduceMin": 18, "ReduceProd": 18, "ReduceL1": 18, "ReduceL2": 18, "ReduceLogSum": 18,
                       "ReduceLogSumExp": 18, "ReduceSumSquare": 18}


def axes_of(node: Node, opset: int) -> list[int] | None:
    """The ``axes`` of Squeeze/Unsqueeze/Reduce*, from the attribute or the constant input (opset-aware).

    None when the axes are absent or not known at optimization time.
    """
    if opset >= AXES_AS_INPUT_SINCE.get(node.op_type, 10**9):
        source = node.input(1)
        if source is None:
            return None
        data = source.constant_value()
        return None if data is None else [int(a) for a in np.reshape(data, -1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


def constant_input(node: Node, slot: int) -> np.ndarray | None:
    """The value of a node input known at optimization time, or None."""
    value = node.input(slot)
    return None if value is None else value.constant_value()


def per_tensor_params(node: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The scale and zero point (None when omitted) of a QuantizeLinear / DequantizeLinear, when each is one
    value known offline; otherwise None (per axis, or computed at run time)."""
    scale, zero = constant_input(node, 1), constant_input(node, 2)
    if scale is None or scale.size != 1 or (node.input(2) is not None and (zero is None or zero.size != 1)):
        return None
    return scale, zero


def add_constant(graph: Graph, base: str, array: np.ndarray) -> Value:
    """A new initializer in ``graph`` (fresh name), typed from the array."""
    return graph.add_initializer(base, np.asarray(array))


# --- Shapes, bypassing and removal (cleanup, folding and eliminations; shared with every family) --------------
def same_dim(a, b) -> bool:
    """Two dims known to be equal: the same int, or the same symbolic name (never two unknowns)."""
    return a is not None and a == b


def same_shape(a, b) -> bool:
    """Two shapes known to be equal, dim by dim (unknown rank or unknown dims are never equal)."""
    return a is not None and b is not None and len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def static_shape(value: Value) -> tuple[int, ...] | None:
    shape = value.shape
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def bypass_refusal(old: Value, new: Value) -> str | None:
    """Why ``Graph.bypass(old, new)`` would refuse, as a sentence; None when it will succeed."""
    graph = old.graph
    if not old.is_graph_output:
        return None
    if new.producer is None or new.graph is not graph:
        return (f"{old.name!r} is a graph output and {new.name!r} is not produced by a node of the same graph, "
                f"so the output cannot keep its name")
    if new.is_graph_output or new.is_graph_input:
        return f"{old.name!r} and {new.name!r} are both graph inputs or outputs, so one name would be lost"
    if old.dtype and new.dtype and old.dtype != new.dtype:
        return f"graph output {old.name!r} would change its element type"
    return None


def int_list(value: Value | None) -> list[int] | None:
    """A constant integer tensor as a flat list of ints, or None when absent or not known."""
    if value is None:
        return None
    data = value.constant_value()
    if data is None or not np.issubdtype(data.dtype, np.integer):
        return None
    return [int(x) for x in np.reshape(data, -1)]


def ints_input_or_attr(node: Node, slot: int, attr: str, opset: int, since: int) -> list[int] | None:
    """Integer list given as an attribute before opset ``since`` and as a constant input from it on.

    Returns None when it is absent or not known at optimization time (use the op's default then).
    """
    if opset >= since:
        return int_list(node.input(slot))
    found = node.attr(attr)
    return None if found is None else [int(x) for x in found]


def remove_dead(graph: Graph, node: Node) -> list[str]:
    """Remove ``node`` if none of its outputs is used, then its producers that became unused, recursively.

    Returns the names of the removed nodes (for the trace).
    """
    removed: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current.graph is not graph or any(v.is_used for v in current.outputs):
            continue
        producers = [v.producer for v in current.inputs if v is not None and v.producer is not None]
        removed.append(current.name)
        graph.remove_node(current)
        stack.extend(p for p in producers if p.graph is graph)
    return removed


def move_node(node: Node, graph: Graph, before: Node) -> None:
    """Move ``node`` (from a body) into ``graph`` before ``before``, keeping its name, outputs and uses.

    Names are unique model-wide, so the node and its outputs keep theirs; the caller makes sure every value
    the node reads is visible from ``graph``.
    """
    node.graph._unlink(node)  # keeps inputs and their uses; forgets the outputs in the old graph
    graph.insert_before(before, node)


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


def is_uniform(array: np.ndarray) -> bool:
    """All elements are one repeated value by construction (a broadcast view), checked without reading."""
    return array.size <= 1 or all(stride == 0 for stride in array.strides)


def _bits(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "fciub" and array.dtype.itemsize in (1, 2, 4, 8):
        return array.view(f"u{array.dtype.itemsize}") if array.dtype.kind != "b" else array
    return array


def _first(array: np.ndarray) -> np.ndarray:
    return np.asarray(array[(0,) * array.ndim]).reshape(1)


def arrays_equal(a: np.ndarray, b: np.ndarray, block_bytes: int = 16 << 20) -> bool:
    """Bitwise equality (so -0.0 differs from 0.0 and a NaN equals itself), in blocks to bound memory."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.size == 0:
        return True
    if is_uniform(a) and is_uniform(b):
        return bool(np.array_equal(_bits(_first(a)), _bits(_first(b))))
    if a.ndim == 0 or a.nbytes <= block_bytes:
        return bool(np.array_equal(_bits(np.ascontiguousarray(a)), _bits(np.ascontiguousarray(b))))
    if a[0].nbytes > block_bytes:
        return all(arrays_equal(a[i], b[i], block_bytes) for i in range(a.shape[0]))
    step = max(1, block_bytes // max(1, a[0].nbytes))
    return all(arrays_equal(a[i:i + step], b[i:i + step], block_bytes) for i in range(0, a.shape[0], step))


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
