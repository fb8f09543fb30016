"""Turn arena plans into the JSON-able ``memory`` section of the optimize report."""
from __future__ import annotations

from typing import Sequence

from worker.memory.plan import ArenaPlan


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


def memory_summary(memory: dict) -> str:
    """A few lines for the CLI: each arena against its bound and Paddle-Lite, weights, MACs, unplanned."""
    from worker.memory.timeline_svg import human_bytes

    lines = []
    for arena in memory["arenas"]:
        paddle = memory["paddle_lite_style_bytes"].get(arena["space"])
        lines.append(f"memory {arena['space']}: arena {human_bytes(arena['arena_bytes'])} "
                     f"(lower bound {human_bytes(arena['lower_bound_bytes'])}, ratio {arena['ratio']:.3f}; "
                     f"Paddle-Lite-style {human_bytes(paddle)}; no reuse {human_bytes(arena['naive_bytes'])}), "
                     f"peak at step {arena['peak_step']} ({arena['peak_node']})")
    weights = ", ".join(f"{space} {human_bytes(n)}" for space, n in memory["weights_bytes"].items())
    io = "unknown" if memory["io_bytes"] is None else human_bytes(memory["io_bytes"])
    macs = f"{memory['macs']['total']:,}"
    if memory["macs"]["unknown"]:
        macs += f" (not counting {len(memory['macs']['unknown'])} node(s) whose shapes are unknown)"
    lines.append(f"weights: {weights or 'none'}; inputs and outputs: {io}; MACs: {macs}")
    lines += [f"not planned ({entry['space']}): {entry['reason']}" for entry in memory["unplanned"]]
    return "\n".join(lines)
