"""Offset planning: greedy by size with best fit, tried under several orderings, smallest arena kept.

Greedy by size (TFLite's arena planner; Pisarchyk & Lee 2020) places buffers one by one in a fixed order: each
goes into the smallest gap, among the buffers already placed that are live at the same time, that holds it,
else on top of them. The order decides the result, and no single order wins on every graph, so like XLA and
ExecuTorch the planner runs several (largest first, longest-lived first, largest size x lifetime first) and
keeps the smallest arena, stopping early once one reaches the lower bound since nothing can beat that; when
none does, the buffers that set the top of the best arena are placed first and the rest again. On
the rare graph where Paddle-Lite's name-order clustering beats all of them, its layout is kept instead, so
the arena is never above the figure it is compared with.
Ties are broken by first step then buffer id, so the same buffers always give the same plan.

Overlap queries are vectorised with numpy over the buffers placed so far: a few thousand buffers (a
BERT-base graph) plan in a few tens of milliseconds per ordering.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from worker.engine.memory.liveness import live_profile
from worker.engine.memory.paddle_lite import paddle_lite_layout
from worker.engine.memory.plan import ArenaPlan, Buffer, Placement

SortKey = Callable[[Buffer], tuple]

#: The name of the fallback layout, the Paddle-Lite clustering itself, when it beats every ordering.
PADDLE_LITE_CLUSTERS = "paddle_lite_clusters"

#: Rounds of promoting the buffers on top of the arena to the front of the best ordering (``_promote_top``).
PROMOTION_ROUNDS = 4

#: The orderings tried, in this order; on equal arenas the earlier one is kept.
ORDERINGS: dict[str, SortKey] = {
    "size": lambda b: (-b.size, b.first, b.id),
    "lifetime": lambda b: (-b.length, -b.size, b.first, b.id),
    "size_x_lifetime": lambda b: (-b.size * b.length, -b.size, b.first, b.id),
}


def place_in_order(ordered: Sequence[Buffer]) -> tuple[list[int], int]:
    """Best-fit offsets for ``ordered`` placed in that order; returns (offsets in that order, arena bytes)."""
    count = len(ordered)
    firsts = np.fromiter((b.first for b in ordered), np.int64, count)
    lasts = np.fromiter((b.last for b in ordered), np.int64, count)
    offsets = np.zeros(count, np.int64)
    ends = np.zeros(count, np.int64)
    arena = 0
    for index, buffer in enumerate(ordered):
        offset = _best_fit(buffer, firsts[:index], lasts[:index], offsets[:index], ends[:index])
        offsets[index] = offset
        ends[index] = offset + buffer.size
        arena = max(arena, offset + buffer.size)
    return offsets.tolist(), arena


def _best_fit(buffer: Buffer, firsts, lasts, offsets, ends) -> int:
    """The lowest-waste offset for ``buffer`` among placed buffers that are live while it is."""
    if buffer.size == 0:
        return 0
    live = np.flatnonzero((firsts <= buffer.last) & (lasts >= buffer.first) & (ends > offsets))
    if live.size == 0:
        return 0
    by_offset = np.argsort(offsets[live], kind="stable")
    starts = offsets[live][by_offset]
    reach = np.maximum.accumulate(ends[live][by_offset])
    # Gap i lies below placed buffer i, above everything placed lower than it.
    floors = np.concatenate(([0], reach[:-1]))
    gaps = starts - floors
    fitting = np.flatnonzero(gaps >= buffer.size)
    if fitting.size == 0:
        return int(reach[-1])
    best = fitting[np.argmin(gaps[fitting])]
    return int(floors[best])


def plan_arena(space: str, buffers: Iterable[Buffer], steps: int | None = None,
               naive_bytes: int | None = None, orderings: Sequence[str] = tuple(ORDERINGS)) -> ArenaPlan:
    """Plan one memory space.

    Args:
        steps: length of the execution order, so the timeline covers steps where nothing of this arena is
            live; defaults to just past the last buffer.
        naive_bytes: the no-reuse total to report; defaults to the sum of buffer sizes.
    """
    buffers = sorted(buffers, key=lambda b: b.id)
    _check_unique_ids(buffers)
    profile = live_profile(buffers, steps)
    arena, ordering, placements = _best_greedy(buffers, orderings, profile.lower_bound)
    cluster_offsets, cluster_bytes = paddle_lite_layout(buffers)
    if cluster_bytes < arena:
        arena, ordering = cluster_bytes, PADDLE_LITE_CLUSTERS
        placements = [Placement(b, cluster_offsets[b.id]) for b in buffers]
    placements.sort(key=lambda p: (p.offset, p.buffer.first, p.buffer.id))
    return ArenaPlan(
        space=space, placements=tuple(placements), arena_bytes=arena, profile=profile,
        naive_bytes=sum(b.size for b in buffers) if naive_bytes is None else naive_bytes,
        ordering=ordering, paddle_lite_style_bytes=cluster_bytes)


def _best_greedy(buffers: Sequence[Buffer], orderings: Sequence[str],
                 lower_bound: int) -> tuple[int, str, list[Placement]]:
    """The smallest greedy arena over ``orderings``, stopping at the first that reaches the lower bound;
    above it, the best ordering is improved by promoting the buffers that set the top (``_promote_top``)."""
    best: tuple[int, str, list[Placement]] = (0, orderings[0], [])
    best_order: list[Buffer] = []
    for index, name in enumerate(orderings):
        ordered = sorted(buffers, key=ORDERINGS[name])
        offsets, arena = place_in_order(ordered)
        if index == 0 or arena < best[0]:
            best = (arena, name, [Placement(b, o) for b, o in zip(ordered, offsets)])
            best_order = ordered
        if arena <= lower_bound:
            return best
    return _promote_top(best, best_order, lower_bound)


def _promote_top(best: tuple[int, str, list[Placement]], ordered: list[Buffer],
                 lower_bound: int) -> tuple[int, str, list[Placement]]:
    """Iterated greedy: place the buffers that reach the top of the arena first, and place again.

    A buffer greedy placed late lands on top when the earlier ones left it no gap, though a gap would have
    been left had it gone first (two phases of a graph whose large buffers sit at the same offsets, each with
    a small long-lived buffer that overlaps the other's at one step). Each round keeps a strictly smaller
    arena; at most ``PROMOTION_ROUNDS`` rounds, as many placements as the orderings above.
    """
    arena, name, placements = best
    for _ in range(PROMOTION_ROUNDS):
        if arena <= lower_bound:
            break
        top = {p.buffer.id for p in placements if p.offset + p.buffer.size == arena}
        candidate = [b for b in ordered if b.id in top] + [b for b in ordered if b.id not in top]
        offsets, size = place_in_order(candidate)
        if size >= arena:
            break
        arena, ordered = size, candidate
        name = f"{best[1]}+promoted"
        placements = [Placement(b, o) for b, o in zip(candidate, offsets)]
    return arena, name, placements


def plan_spaces(buffers: Iterable[Buffer], steps: int | None = None,
                naive_bytes: dict[str, int] | None = None) -> tuple[ArenaPlan, ...]:
    """One arena per memory space named by the buffers, in space-name order."""
    by_space: dict[str, list[Buffer]] = {}
    for buffer in buffers:
        by_space.setdefault(buffer.space, []).append(buffer)
    naive_bytes = naive_bytes or {}
    return tuple(plan_arena(space, by_space[space], steps, naive_bytes.get(space))
                 for space in sorted(by_space))


def _check_unique_ids(buffers: Sequence[Buffer]) -> None:
    for before, after in zip(buffers, buffers[1:]):
        if before.id == after.id:
            raise ValueError(f"buffer id {before.id!r} appears twice in one arena")
