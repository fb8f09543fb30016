"""Reading an op's operands whatever the opset: axes and integer lists given as attributes or constant inputs,
constant inputs, per-tensor Q/DQ parameters."""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node, Value

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


def per_tensor_params(node: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The scale and zero point (None when omitted) of a QuantizeLinear / DequantizeLinear, when each is one
    value known offline; otherwise None (per axis, or computed at run time)."""
    scale, zero = constant_input(node, 1), constant_input(node, 2)
    if scale is None or scale.size != 1 or (node.input(2) is not None and (zero is None or zero.size != 1)):
        return None
    return scale, zero


def slice_arguments(node: Node, opset: int) -> tuple[list[int], list[int], list[int] | None, list[int] | None] | str:
    """(starts, ends, axes or None, steps or None), or a sentence when they are not known."""
    if opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
        if starts is None or ends is None:
            return "its starts or ends are missing"
        return list(starts), list(ends), None if axes is None else list(axes), None
    starts, ends = int_list(node.input(1)), int_list(node.input(2))
    axes = int_list(node.input(3)) if node.input(3) is not None else None
    steps = int_list(node.input(4)) if node.input(4) is not None else None
    if starts is None or ends is None or (node.input(3) is not None and axes is None) \
            or (node.input(4) is not None and steps is None):
        return "its starts, ends, axes or steps are not known at optimization time"
    return starts, ends, axes, steps
