"""Who is registering: every registry (passes, filters, pipelines, targets, domain ops, kernels) stamps new
entries with the current origin, "built-in" unless a plugin is being loaded.

One context for all of them, so that whatever a plugin registers, through any API, carries the plugin's name:
listings can show it, clashes can name it, and a plugin that fails half-way can be undone through the
registries' own unregister hooks (which keep built-ins).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

BUILT_IN = "built-in"
_CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("mirserve_origin", default=BUILT_IN)


def current_origin() -> str:
    return _CURRENT.get()


@contextlib.contextmanager
def registering_as(origin: str) -> Iterator[None]:
    """Attribute every registration made inside the block to ``origin`` (a plugin file or package)."""
    token = _CURRENT.set(origin)
    try:
        yield
    finally:
        _CURRENT.reset(token)
