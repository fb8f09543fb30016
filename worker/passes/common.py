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


def add_constant(graph: Graph, base: str, array: np.ndarray) -> Value:
    """A new initializer in ``graph`` (fresh name), typed from the array."""
    return graph.add_initializer(base, np.asarray(array))
