"""The few figures of an engine report worth keeping in the job row (the full report stays on disk)."""
from __future__ import annotations

from typing import Any, Mapping


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
    memory = report.get("memory") or {}
    return {
        "nodes_before": before.get("nodes"),
        "nodes_after": after.get("nodes"),
        "bytes_before": before.get("bytes"),
        "bytes_after": after.get("bytes"),
        "passes_run": sum(1 for t in trace if not t.get("skipped")),
        "rewrites": sum(int(t.get("rewrites") or 0) for t in trace),
        "places": report.get("places"),
        "verified": verification.get("passed") if verification else None,
        "max_abs_diff": max(diffs) if diffs else None,
        "peak_bytes": _first_number(memory, ("peak_bytes", "planned_bytes", "arena_bytes")),
        "seconds": report.get("seconds"),
    }


def _first_number(data: Mapping[str, Any], keys: tuple[str, ...]) -> int | float | None:
    for key in keys:
        value = data.get(key) if isinstance(data, Mapping) else None
        if isinstance(value, (int, float)):
            return value
    return None
