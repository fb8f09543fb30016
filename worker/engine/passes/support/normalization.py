"""Reading the constants of normalizations written out as reductions (layer_norm_fuse, rms_norm_fuse): the
axes a ReduceMean averages over, a scalar constant, and a scale or bias broadcast to the normalized shape."""
from __future__ import annotations

import numpy as np

from worker.engine.passes.support.operands import axes_of


def scalar(value) -> float | None:
    data = None if value is None else value.constant_value()
    return None if data is None or data.size != 1 else float(np.reshape(data, -1)[0])


def normalized_axes(reduce, opset: int, rank: int) -> list[int] | None:
    """The dims a ReduceMean averages over, normalized; None when not known or keepdims is off."""
    if not reduce.attr("keepdims", 1):
        return None
    axes = axes_of(reduce, opset)
    if axes is None:
        if reduce.attr("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(a % rank for a in axes)


def trailing_axis(axes: list[int] | None, rank: int) -> int | None:
    """The first of ``axes`` when they are a trailing block of dims (what the normalization ops take)."""
    return axes[0] if axes and axes == list(range(axes[0], rank)) else None


def affine_constant(value, x_shape, axis: int) -> np.ndarray | None:
    """gamma/beta broadcast to exactly the normalized shape; None when they vary along other dims."""
    data = value.constant_value()
    rank = len(x_shape)
    if data is None or data.ndim > rank:
        return None
    aligned = data.reshape((1,) * (rank - data.ndim) + data.shape)
    if any(d != 1 for d in aligned.shape[:axis]):
        return None
    try:
        return np.broadcast_to(aligned.reshape(aligned.shape[axis:]), tuple(x_shape[axis:])).copy()
    except ValueError:
        return None
