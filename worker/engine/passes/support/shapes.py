"""Comparing shapes that may hold symbolic or unknown dims: equal only when known to be equal."""
from __future__ import annotations

from worker.engine.ir import Value


def same_dim(a, b) -> bool:
    """Two dims known to be equal: the same int, or the same symbolic name (never two unknowns)."""
    return a is not None and a == b


def same_shape(a, b) -> bool:
    """Two shapes known to be equal, dim by dim (unknown rank or unknown dims are never equal)."""
    return a is not None and b is not None and len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def static_shape(value: Value) -> tuple[int, ...] | None:
    shape = value.shape
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None
