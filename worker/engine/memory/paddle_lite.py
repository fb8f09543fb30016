"""The arena Paddle-Lite's memory_optimize_pass would need on the same live intervals, for comparison.

Paddle-Lite visits buffers in variable-name order; the first unclustered one opens a cluster, and every later
buffer whose interval overlaps no member yet joins it. Each cluster becomes one block as large as its largest
member, and the arena is the sum of the blocks. Sizes play no part in the decisions, which is why it lands
well above the lower bound on graphs with mixed sizes (NOTES.md section 4).

Building cluster after cluster like that is the same as one pass in name order putting each buffer into the
first cluster it fits (first-fit interval colouring), which is what is done here: a cluster's members never
overlap each other, so "fits" is a bisection into its members sorted by first step.
"""
from __future__ import annotations

import bisect
from typing import Iterable

from worker.engine.memory.plan import Buffer


class _Cluster:
    __slots__ = ("firsts", "lasts", "size")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        self.size = 0

    def fits(self, buffer: Buffer) -> bool:
        """True when ``buffer`` overlaps no member (members are disjoint, so only two neighbours matter)."""
        index = bisect.bisect_right(self.firsts, buffer.last)
        return index == 0 or self.lasts[index - 1] < buffer.first

    def add(self, buffer: Buffer) -> None:
        index = bisect.bisect_right(self.firsts, buffer.last)
        self.firsts.insert(index, buffer.first)
        self.lasts.insert(index, buffer.last)
        self.size = max(self.size, buffer.size)


def paddle_lite_clusters(buffers: Iterable[Buffer]) -> list[list[str]]:
    """Buffer ids per cluster, clusters in the order Paddle-Lite opens them."""
    clusters: list[_Cluster] = []
    members: list[list[str]] = []
    for buffer in sorted(buffers, key=lambda b: b.id):
        for cluster, names in zip(clusters, members):
            if cluster.fits(buffer):
                cluster.add(buffer)
                names.append(buffer.id)
                break
        else:
            cluster = _Cluster()
            cluster.add(buffer)
            clusters.append(cluster)
            members.append([buffer.id])
    return members


def paddle_lite_style_bytes(buffers: Iterable[Buffer]) -> int:
    """Sum over clusters of the largest member: the memory the name-order clustering reserves."""
    return paddle_lite_layout(buffers)[1]


def paddle_lite_layout(buffers: Iterable[Buffer]) -> tuple[dict[str, int], int]:
    """The clustering as a placement: clusters stacked in opening order, each as large as its largest member.

    Returns (offset per buffer id, arena bytes). Members of a cluster never overlap in time, so sharing the
    cluster's block is safe; the planner falls back to this layout on the rare graph where it beats every
    greedy ordering, so its arena is never above the Paddle-Lite figure.
    """
    buffers = list(buffers)
    size_of = {b.id: b.size for b in buffers}
    offsets, top = {}, 0
    for names in paddle_lite_clusters(buffers):
        for name in names:
            offsets[name] = top
        top += max(size_of[name] for name in names)
    return offsets, top
