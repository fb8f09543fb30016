"""Turn arena plans into the JSON-able ``memory`` section of the optimize report."""
from __future__ import annotations

from typing import Sequence

from worker.engine.memory.plan import ArenaPlan


def arena_report(plan: ArenaPlan, node_names: Sequence[str] = ()) -> dict:
    """Per-arena figures, the timeline and every planned buffer with its offset and live steps."""
    peak = plan.profile.peak_step
    return {
        "space": plan.space,
        "naive_bytes": plan.naive_bytes,
        "lower_bound_bytes": plan.lower_bound_bytes,
        "arena_bytes": plan.arena_bytes,
        "ratio": round(plan.ratio, 6),
        "peak_step": peak,
        "peak_node": node_names[peak] if peak < len(node_names) else None,
        "timeline": list(plan.profile.timeline),
        "values": [{"name": p.buffer.id, "offset": p.offset, "size": p.buffer.size,
                    "first": p.buffer.first, "last": p.buffer.last} for p in plan.placements],
    }
