"""An independent check of a memory report: it reads only the report dict, never the planner's code.

For every arena it checks that each value fits inside the arena, that no two values overlap in both live steps
and bytes, that the timeline is the sum of the values' sizes at each step, and that the lower bound, peak step
and ratio follow from that timeline. Written apart from worker/engine/memory on purpose: a planner bug must not be able
to hide behind a shared helper.
"""
from __future__ import annotations

from typing import Mapping


def check_arena(arena: Mapping) -> list[str]:
    """Every problem found in one arena entry, as sentences; empty when the plan is sound."""
    problems = []
    values = arena["values"]
    size_limit = arena["arena_bytes"]
    for value in values:
        if value["offset"] < 0 or value["offset"] + value["size"] > size_limit:
            problems.append(f"{value['name']} at [{value['offset']}, {value['offset'] + value['size']}) "
                            f"does not fit the {size_limit}-byte arena")
        if value["first"] > value["last"] or value["first"] < 0:
            problems.append(f"{value['name']} has a bad interval [{value['first']}, {value['last']}]")
        if value["offset"] % 64 or value["size"] % 64:
            problems.append(f"{value['name']} is not 64-byte aligned")
    problems += _overlaps(values)
    problems += _timeline_problems(arena)
    return problems


def _overlaps(values) -> list[str]:
    """Sweep in step order; compare each value only with those still live when it starts."""
    problems, live = [], []
    for value in sorted(values, key=lambda v: (v["first"], v["name"])):
        live = [other for other in live if other["last"] >= value["first"]]
        for other in live:
            if value["size"] and other["size"] and value["offset"] < other["offset"] + other["size"] \
                    and other["offset"] < value["offset"] + value["size"]:
                problems.append(f"{value['name']} and {other['name']} share bytes while both are live")
        live.append(value)
    return problems


def _timeline_problems(arena: Mapping) -> list[str]:
    timeline = arena["timeline"]
    expected = [0] * len(timeline)
    for value in arena["values"]:
        if value["last"] >= len(timeline):
            return [f"{value['name']} is live past the end of the timeline"]
        for step in range(value["first"], value["last"] + 1):
            expected[step] += value["size"]
    problems = []
    if list(timeline) != expected:
        problems.append("the timeline is not the sum of the live values' sizes")
    peak = max(expected, default=0)
    if arena["lower_bound_bytes"] != peak:
        problems.append(f"lower bound {arena['lower_bound_bytes']} is not the peak of live bytes {peak}")
    if expected and expected[arena["peak_step"]] != peak:
        problems.append(f"peak step {arena['peak_step']} does not reach the peak")
    if arena["arena_bytes"] < peak:
        problems.append("the arena is smaller than the bytes live at the peak")
    if peak and abs(arena["ratio"] - arena["arena_bytes"] / peak) > 1e-5:
        problems.append("the ratio is not arena / lower bound")
    return problems


def check_memory_report(memory: Mapping) -> list[str]:
    """Problems in every arena of a report's ``memory`` section, each prefixed by its space."""
    problems = []
    spaces = [arena["space"] for arena in memory["arenas"]]
    if len(spaces) != len(set(spaces)):
        problems.append(f"a memory space has more than one arena: {spaces}")
    for arena in memory["arenas"]:
        problems += [f"{arena['space']}: {p}" for p in check_arena(arena)]
    return problems
