"""The pass trace as a Chrome trace-event file, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

One complete event (``"ph": "X"``) per pass that ran, with its figures and rewrites as ``args``; a fixed-point
group of passes is a slice that encloses its passes; a skipped pass is an instant event (``"ph": "i"``) that
says why; the numeric verification, which runs while the model is saved after the last pass, is a slice of its
own track. Times are microseconds from the start of the pass pipeline (the trace entries' ``start``; a report
without it, from before that field existed, is laid out pass after pass).

Format: the "JSON Object Format" of the Trace Event Format document (Google, 2016): ``traceEvents`` plus
``displayTimeUnit``; metadata events (``"ph": "M"``) name the process and the tracks.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

PID = 1
PASSES_TID, VERIFY_TID = 1, 2
#: Rewrites kept per slice: a folding pass can rewrite thousands of nodes, and a trace file must stay loadable.
MAX_DETAILS = 50
#: Entry fields shown as the slice itself (name, time) rather than as args.
_OWN_FIELDS = {"pass", "start", "seconds", "details", "skipped"}


def chrome_trace(report: Mapping[str, Any], title: str | None = None) -> dict[str, Any]:
    """The trace-event document of a report's ``trace`` (and verification)."""
    title = title or _title(report)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "ts": 0, "args": {"name": title}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": PASSES_TID, "ts": 0, "args": {"name": "passes"}},
    ]
    end = 0
    for entry, start, duration in timed_entries(report.get("trace") or []):
        events.append(_event(entry, start, duration))
        end = max(end, start + duration)
    verification = report.get("verification")
    if isinstance(verification, Mapping) and isinstance(verification.get("seconds"), (int, float)):
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": VERIFY_TID, "ts": 0,
                       "args": {"name": "verification"}})
        events.append({"name": "verification", "cat": "verification", "ph": "X", "pid": PID, "tid": VERIFY_TID,
                       "ts": end, "dur": _micros(verification["seconds"]),
                       "args": {k: v for k, v in verification.items() if k not in ("outputs", "seconds")}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "mirserve", "version": str(report.get("version") or ""),
                          "pipeline": str(report.get("pipeline") or ""), "places": report.get("places") or []}}


def _title(report: Mapping[str, Any]) -> str:
    model = (report.get("model") or {}).get("input") or {}
    name = str(model.get("path") or "model").replace("\\", "/").rsplit("/", 1)[-1]
    return f"mirserve optimize {name}"


def timed_entries(trace: Iterable[Mapping[str, Any]]) -> Iterable[tuple[Mapping[str, Any], int, int]]:
    """(entry, start, duration) in microseconds. Without recorded starts, entries follow one another and a
    fixed-point group (listed after its passes) spans them."""
    cursor, group_start = 0, None
    for entry in trace:
        if not isinstance(entry, Mapping):
            continue
        duration = _micros(entry.get("seconds") or 0)
        if isinstance(entry.get("start"), (int, float)):
            start = _micros(entry["start"])
        elif entry.get("kind") == "fixed_point":
            start = cursor if group_start is None else group_start
            duration = max(duration, cursor - start)
            group_start = None
        else:
            start = cursor
            if "iteration" in entry and group_start is None:
                group_start = start
        if entry.get("kind") != "fixed_point":
            cursor = max(cursor, start + duration)
        yield entry, start, duration


def _event(entry: Mapping[str, Any], start: int, duration: int) -> dict[str, Any]:
    name = str(entry.get("pass"))
    args = {k: v for k, v in entry.items() if k not in _OWN_FIELDS}
    if entry.get("skipped"):
        args["skipped"] = entry["skipped"]
        return {"name": name, "cat": "skipped", "ph": "i", "s": "t", "pid": PID, "tid": PASSES_TID, "ts": start,
                "args": args}
    details = list(entry.get("details") or [])
    if details:
        args["details"] = details[:MAX_DETAILS]
        if len(details) > MAX_DETAILS:
            args["details_not_shown"] = len(details) - MAX_DETAILS
    # A zero-length slice is invisible in Perfetto; one microsecond keeps a pass that ran findable.
    return {"name": name, "cat": str(entry.get("kind") or "pass"), "ph": "X", "pid": PID, "tid": PASSES_TID,
            "ts": start, "dur": max(duration, 1), "args": args}


def _micros(seconds: float) -> int:
    return int(round(float(seconds) * 1_000_000))
