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

A model whose input dims are open is planned at the sample shapes verification runs (``ctx.sample_shapes``;
a dim bound given for an open dim takes its place), and ``symbolic`` gives the arena and peak of each space
and the io bytes as formulas of the open dims, fitted to plans at several sizes and checked at others
(``worker/engine/memory/formulas.py``).
"""
from __future__ import annotations

from worker.engine.memory.estimate import estimate_memory, in_place_summary
from worker.engine.memory.formulas import Sample, fit_memory
from worker.engine.memory.sizing import Sizing, applicable_bounds
from worker.engine.inference import types_at
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.sample_shapes import graph_specs, shapes


@register_pass(name="memory_plan", peer="Paddle-Lite", kind=PassKind.DEBUG, level=0,
               description="plan an arena per memory space over the final execution order and report "
                       "memory and MAC estimates (formulas of the open input dims for a dynamic model)")
def memory_plan(ctx: PassContext) -> PassResult:
    samples = ctx.sample_shapes
    if samples and samples.get("dims"):
        section, plan = _plan_open_dims(ctx, samples)
    else:
        section, plan = estimate_memory(ctx.graph, ctx.options.dim_bounds, **_macs_context(ctx))
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
    if "symbolic" in section:
        result.data["formulas"] = {space: fits["arena_bytes"]["formula"]
                                   for space, fits in section["symbolic"]["spaces"].items()}
    return result


def _macs_context(ctx: PassContext) -> dict:
    """What MACs need to count inside function bodies: the opset and the model's own functions."""
    return {"opset": ctx.opset(""), "functions": {(f.domain, f.name): f for f in ctx.model.functions}}


def _plan_open_dims(ctx: PassContext, samples: dict):
    """The plan at the sample dims (or at the user's bounds of them), with formulas of the open dims."""
    bounds = ctx.options.dim_bounds
    Sizing.from_bounds(ctx.graph, bounds)  # refuses a bound that names neither an open dim nor a value
    base = {dim: bounds.get(dim, value) for dim, value in samples["dims"].items()}
    specs = graph_specs(ctx.graph)
    plans: dict[tuple, tuple] = {}

    def plan_at(point: dict[str, int]) -> Sample:
        with types_at(ctx.model, shapes(specs, {}, point), ctx.options.limits):
            usable = applicable_bounds(ctx.graph, bounds)
            section, plan = estimate_memory(ctx.graph, usable, **_macs_context(ctx))
            sizing = Sizing.from_bounds(ctx.graph, usable)
            sizes = {v.name: sizing.nbytes(v) for g in ctx.graph.all_graphs() for v in g.values()
                     if v.producer is not None}
        plans[tuple(sorted(point.items()))] = section, plan
        planned = {a["space"]: a for a in section["arenas"]}
        spaces = planned.keys() | {e["space"] for e in section["unplanned"]}
        return Sample({s: planned[s]["arena_bytes"] if s in planned else None for s in spaces},
                      {s: planned[s]["lower_bound_bytes"] if s in planned else None for s in spaces},
                      section["io_bytes"], sizes)

    symbolic = fit_memory(plan_at, base)
    section, plan = plans[tuple(sorted(base.items()))]
    section["planned_at"] = {"dims": base, "shapes": {k: list(v) for k, v in shapes(specs, {}, base).items()}}
    section["symbolic"] = symbolic
    return section, plan
