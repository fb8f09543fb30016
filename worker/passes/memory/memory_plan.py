"""memory_plan: live intervals over the final execution order, an arena per memory space, and cost figures.

    final graph -> report["memory"] (the graph is not changed)

Runs last, after kernel pick and the io_copy / calib / layout casts, so the order and places it plans are the
ones a runtime would execute. Each intermediate gets its size from the inferred shape and dtype (rounded up
to 64 bytes) and an interval from its producer to its last reader; views and last-use elementwise ops share
their input's buffer; greedy-by-size best fit, tried under several orderings, places the buffers of each
space. Numeric effect: none. Reported per arena: the lower bound no plan can beat, the arena, their ratio,
the peak step and node, a live-bytes timeline and every buffer's offset; per space the weights; the io bytes;
the Paddle-Lite-style figure on the same intervals; MACs; and what could not be planned, with the reason.
``--dim-bound NAME=N`` (``dim_bounds``) bounds a symbolic dim or a data-dependent output.
"""
from __future__ import annotations

from worker.memory.estimate import estimate_memory, in_place_summary
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.registry import register_pass


@register_pass(name="memory_plan", kind=PassKind.DEBUG, level=0,
               description="plan an arena per memory space over the final execution order and report "
                       "memory and MAC estimates")
def memory_plan(ctx: PassContext) -> PassResult:
    section, plan = estimate_memory(ctx.graph, ctx.options.dim_bounds)
    ctx.report["memory"] = section
    result = PassResult()
    summary = in_place_summary(plan)
    for rule, count in summary.pop("refusals").items():
        result.refusals[f"in-place write refused: {rule}"] += count
    result.data.update(summary)
    result.data["arenas"] = {a["space"]: {"arena_bytes": a["arena_bytes"],
                                          "lower_bound_bytes": a["lower_bound_bytes"], "ratio": a["ratio"]}
                             for a in section["arenas"]}
    result.data["unplanned_spaces"] = sorted({e["space"] for e in section["unplanned"]})
    return result
