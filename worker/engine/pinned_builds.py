"""Builds of one model with different nodes pinned to fp32, from one run of the passes before kernel pick.

Auto mixed precision (``worker.engine.amp``) builds the model again at each step of its search, with another
set of nodes pinned (``PassContext.pinned_fp32``). Only static_kernel_pick reads the pins, so everything
before it (loading, type inference, the rewrites: half of a step's passes on Inception) comes out the same
every time. Here those passes run once; each build runs the rest of the pipeline (kernel pick, casts, memory
plan) on that model inside a savepoint (``ir.journal``), which the next build rolls back first. A build is
what a run from the file with the same pins gives, byte for byte (tests/engine/test_amp.py checks it).

A pipeline whose kernel pick is not a step of its own (inside a fixed-point group, or absent) is built whole
each time, as is any pipeline when passes before kernel pick could read the pins.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Callable, Collection, Sequence

from worker.engine.ir.journal import Journal
from worker.engine.passes import PassContext, PassManager
from worker.engine.passes.pipelines import Step

#: The first pass that reads ``PassContext.pinned_fp32``.
KERNEL_PICK = "static_kernel_pick"

Build = tuple  # (model, ctx, trace, manager), as a run of the whole pipeline leaves them


def split_at(steps: Sequence[Step]) -> int | None:
    """The index of the step that is kernel pick, or None when it is no step of its own."""
    return next((i for i, step in enumerate(steps) if step == KERNEL_PICK), None)


class PinnedBuilds:
    """``build(pinned)`` -> (model, ctx, trace, manager): the model built with the nodes named in ``pinned``
    computing in fp32. A build stays valid until the next one (they share one model); the last one is kept."""

    def __init__(self, load: Callable[[frozenset[str]], PassContext], steps: Sequence[Step],
                 pins: str = "pinned_fp32"):
        """``load(pinned)``: a new context of the model as loaded, with those pins. ``pins``: the context's
        field the pins go in (``kept_fp32_weights`` for the storage fallback: fp16_storage, which reads them,
        runs after kernel pick too)."""
        self._load, self._steps, self._split = load, tuple(steps), split_at(steps)
        self._pins = pins
        self._start: tuple[PassContext, PassManager] | None = None
        self._last: Journal | None = None  # the savepoint of the last build, closed, to roll back
        #: Runs of the passes before kernel pick (once per builder when the pipeline splits).
        self.starts = 0

    def __call__(self, pinned: Collection[str] = ()) -> Build:
        pinned = frozenset(pinned)
        if self._split is None:
            ctx = self._load(pinned)
            self.starts += 1
            manager = PassManager()
            return ctx.model, ctx, manager.run(ctx, self._steps), manager
        start, start_manager = self._started()
        if self._last is not None:
            self._last.rollback()
            self._last = None
        ctx = dataclasses.replace(start, report=copy.deepcopy(start.report), fetch_places=dict(start.fetch_places),
                                  widened=set(start.widened), stored_half=dict(start.stored_half),
                                  **{self._pins: pinned})
        manager = start_manager.fork()
        savepoint = Journal(ctx.model, savepoint=True)
        with savepoint:
            try:
                trace = manager.run(ctx, self._steps, start=self._split)
            except BaseException:
                savepoint.rollback()
                raise
        self._last = savepoint
        return ctx.model, ctx, trace, manager

    def _started(self) -> tuple[PassContext, PassManager]:
        """The context and manager after the passes before kernel pick, run the first time they are needed."""
        if self._start is None:
            ctx = self._load(frozenset())
            self.starts += 1
            manager = PassManager()
            manager.run(ctx, self._steps, stop=self._split)
            self._start = ctx, manager
        return self._start

