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
(``worker/engine/memory/formulas.py``). Types are inferred at the base sizes, with each dim doubled and at the
check sizes; the fit's other sizes take every shape scaled from those (``ScaledShapes``) once the check sizes
have confirmed the scaling for every value, and are listed as ``scaled_at``.
"""
from __future__ import annotations

from worker.engine.memory.estimate import estimate_memory, in_place_summary
from worker.engine.memory.formulas import CHECK_FACTORS, Sample, fit_memory
from worker.engine.memory.sizing import Sizing, applicable_bounds
from worker.engine.inference import shapes_as, types_at
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
    scaled = ScaledShapes(ctx.graph, base)

    def sample(point: dict[str, int]) -> Sample:
        at_base = point == base  # the reported plan; the others only give the formulas their figures
        usable = applicable_bounds(ctx.graph, bounds)
        section, plan = estimate_memory(ctx.graph, usable, **_macs_context(ctx), macs=at_base)
        sizing = Sizing.from_bounds(ctx.graph, usable)
        sizes = {v.name: sizing.nbytes(v) for g in ctx.graph.all_graphs() for v in g.values()
                 if v.producer is not None}
        if at_base:
            plans[tuple(sorted(point.items()))] = section, plan
        planned = {a["space"]: a for a in section["arenas"]}
        spaces = planned.keys() | {e["space"] for e in section["unplanned"]}
        return Sample({s: planned[s]["arena_bytes"] if s in planned else None for s in spaces},
                      {s: planned[s]["lower_bound_bytes"] if s in planned else None for s in spaces},
                      section["io_bytes"], sizes)

    def plan_at(point: dict[str, int]) -> Sample:
        with types_at(ctx.model, shapes(specs, {}, point), ctx.options.limits):
            scaled.saw(point)
            return sample(point)

    def plan_between(point: dict[str, int]) -> Sample | None:
        found = scaled.at(point)
        if found is None:
            return None
        with shapes_as(ctx.model, found):
            return sample(point)

    symbolic = fit_memory(plan_at, base, plan_between)
    symbolic["scaled_at"] = scaled.used
    section, plan = plans[tuple(sorted(base.items()))]
    section["planned_at"] = {"dims": base, "shapes": {k: list(v) for k, v in shapes(specs, {}, base).items()}}
    section["symbolic"] = symbolic
    return section, plan


class ScaledShapes:
    """Every value's shape at a multiple of the base sizes, from its shapes at the base and with each open dim
    doubled, where each of its dims is a product of powers of the open dims (``batch * seq``, ``768``): the
    fit's extra points are then planned without inferring types again.

    Trusted only after it has predicted, exactly, every value's shape at each point typed since (the check
    points, every dim x3 and x4, which the fit plans before its extra points): a shape that is not such a
    product (``seq + 1``, ``ceil(seq / 4)`` at a small base) shows there, and then every point is inferred."""

    def __init__(self, graph, base: dict[str, int]):
        self.graph, self.base, self.dims = graph, dict(base), list(base)
        self.seen: dict[tuple, dict] = {}
        self.exponents: dict | None = None
        self.checked = 0
        self.failed = any(g is not graph for g in graph.all_graphs())  # bodies are typed per point
        self.used: list[dict[str, int]] = []

    def _key(self, point) -> tuple:
        return tuple(point[d] for d in self.dims)

    def saw(self, point: dict[str, int]) -> None:
        """Record the shapes typed at ``point``; at a point it could have predicted, check the prediction."""
        if self.failed:
            return
        here = {v: v.shape for v in self.graph.values()}
        if self.exponents is not None:
            if self.at(point, trusted=False) == here:
                self.checked += 1
            else:
                self.failed = True
            return
        self.seen[self._key(point)] = here
        doubled = [{**self.base, d: 2 * self.base[d]} for d in self.dims]
        if all(self._key(p) in self.seen for p in [self.base, *doubled]):
            self.exponents = self._fit([self.seen[self._key(p)] for p in doubled])

    def _fit(self, doubled: list[dict]) -> dict | None:
        base = self.seen[self._key(self.base)]
        exponents = {}
        for value, shape in base.items():
            others = [d.get(value, ()) for d in doubled]
            if shape is None and all(o is None for o in others):
                exponents[value] = None  # untyped everywhere
                continue
            if shape is None or any(o is None or len(o) != len(shape) for o in others):
                self.failed = True
                return None
            axes = []
            for axis, dim in enumerate(shape):
                seen = [o[axis] for o in others]
                if not isinstance(dim, int) or dim <= 0 or not all(isinstance(x, int) for x in seen):
                    if all(x == dim for x in seen):
                        axes.append((dim, None))  # the same open or data-dependent dim everywhere
                        continue
                    self.failed = True
                    return None
                powers = []
                for x in seen:
                    ratio, rest = divmod(x, dim)
                    if rest or ratio < 1 or ratio & (ratio - 1):
                        self.failed = True
                        return None
                    powers.append(ratio.bit_length() - 1)
                axes.append((dim, tuple(powers)))
            exponents[value] = axes
        return exponents

    def at(self, point: dict[str, int], trusted: bool = True) -> dict | None:
        """The shapes at ``point`` (a multiple of the base in every dim), or None where not trusted."""
        if self.failed or self.exponents is None or (trusted and self.checked < len(CHECK_FACTORS)):
            return None
        factors = []
        for d in self.dims:
            factor, rest = divmod(point[d], self.base[d]) if self.base[d] else (0, 1)
            if rest:
                return None
            factors.append(factor)
        found = {}
        for value, axes in self.exponents.items():
            found[value] = None if axes is None else \
                tuple(dim if powers is None else dim * _product(factors, powers) for dim, powers in axes)
        if trusted:
            self.used.append(dict(point))
        return found


def _product(factors: list[int], powers: tuple) -> int:
    result = 1
    for factor, power in zip(factors, powers):
        result *= factor ** power
    return result
