"""The few figures of an engine report worth keeping in the job row (the full report stays on disk)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping


def summarize(report: Mapping[str, Any]) -> dict[str, Any]:
    """Sizes before and after, passes and rewrites, verification outcome; missing parts become None."""
    model = report.get("model") or {}
    before, after = model.get("input") or {}, model.get("output") or {}
    # Pipeline groups (kind "fixed_point") have trace entries of their own; only passes count.
    trace = [t for t in report.get("trace") or [] if isinstance(t, Mapping) and t.get("kind") != "fixed_point"]
    verification = report.get("verification") or None
    outputs = (verification or {}).get("outputs") or []
    diffs = [o.get("max_abs_diff") for o in outputs if isinstance(o, Mapping)]
    diffs = [d for d in diffs if isinstance(d, (int, float))]
    memory = report.get("memory") if isinstance(report.get("memory"), Mapping) else {}
    return {
        "nodes_before": before.get("nodes"),
        "nodes_after": after.get("nodes"),
        "bytes_before": before.get("bytes"),
        "bytes_after": after.get("bytes"),
        "external_data": bool(after.get("external_data")),
        "passes_run": sum(1 for t in trace if not t.get("skipped")),
        "rewrites": sum(int(t.get("rewrites") or 0) for t in trace),
        "places": report.get("places"),
        "verified": verification.get("passed") if verification else None,
        "max_abs_diff": max(diffs) if diffs else None,
        **_memory_figures(memory),
        "seconds": report.get("seconds"),
    }


def _memory_figures(memory: Mapping[str, Any]) -> dict[str, Any]:
    """Planned activation bytes and weight bytes over all memory spaces, and total MACs."""
    arenas = [a for a in memory.get("arenas") or [] if isinstance(a, Mapping)]
    weights, macs = memory.get("weights_bytes"), memory.get("macs")
    return {"arena_bytes": _total(a.get("arena_bytes") for a in arenas),
            "weights_bytes": _total(weights.values()) if isinstance(weights, Mapping) else None,
            "macs": macs.get("total") if isinstance(macs, Mapping) else None}


def _total(values: Iterable[Any]) -> int | None:
    """The sum of the numbers (over memory spaces), None when there are none."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(numbers) if numbers else None
