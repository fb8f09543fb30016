"""The plain data of a memory plan: buffers in, placements and per-arena figures out.

Everything here is immutable and independent of the IR, so the planner can be tested, benchmarked and
reasoned about on hand-written intervals. Steps are positions in the final execution order; a buffer's live
interval ``[first, last]`` is inclusive at both ends (written at ``first``, last read at ``last``).
"""
from __future__ import annotations

from dataclasses import dataclass

#: Every planned buffer starts on this boundary, so sizes are rounded up to it (as TFLite and onnxruntime do).
ALIGNMENT = 64


def aligned(size: int, alignment: int = ALIGNMENT) -> int:
    """``size`` rounded up to a multiple of ``alignment``."""
    if size < 0:
        raise ValueError(f"a buffer size cannot be negative (got {size})")
    return -(-size // alignment) * alignment


@dataclass(frozen=True)
class Buffer:
    """One block of memory to place: all values that share it (views, in-place results) live in it."""

    id: str
    size: int
    first: int
    last: int
    space: str = "host"

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"buffer {self.id!r} has a negative size {self.size}")
        if not 0 <= self.first <= self.last:
            raise ValueError(f"buffer {self.id!r} has a bad live interval [{self.first}, {self.last}]")

    @property
    def length(self) -> int:
        """How many steps the buffer is live."""
        return self.last - self.first + 1

    def overlaps_in_time(self, other: "Buffer") -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Placement:
    buffer: Buffer
    offset: int

    @property
    def end(self) -> int:
        return self.offset + self.buffer.size


@dataclass(frozen=True)
class LiveProfile:
    """Live bytes per step of one arena; its maximum is the lower bound no placement can beat."""

    timeline: tuple[int, ...]
    lower_bound: int
    peak_step: int


@dataclass(frozen=True)
class ArenaPlan:
    """The placement of every buffer of one memory space, with the figures that judge it."""

    space: str
    placements: tuple[Placement, ...]
    arena_bytes: int
    profile: LiveProfile
    naive_bytes: int
    ordering: str
    paddle_lite_style_bytes: int

    @property
    def lower_bound_bytes(self) -> int:
        return self.profile.lower_bound

    @property
    def ratio(self) -> float:
        """Arena over lower bound; 1.0 is optimal (and an empty arena is trivially optimal)."""
        if self.profile.lower_bound == 0:
            return 1.0
        return self.arena_bytes / self.profile.lower_bound

    def offset_of(self, buffer_id: str) -> int:
        for placement in self.placements:
            if placement.buffer.id == buffer_id:
                return placement.offset
        raise KeyError(buffer_id)
