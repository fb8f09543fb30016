"""Runs a pipeline: decides which passes apply, runs them, and records a trace entry for each.

Skip rules, checked in this order (the first that holds is the recorded reason): disabled by the user; opt
level above the requested one; emits own-domain ops under --portable; bound targets not among the valid
places; an excluded target among them; a bound kernel registered for no valid target.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Protocol, Sequence

from worker.errors import MirserveError, PassError
from worker.passes.base import Pass, PassContext, PassKind, PassResult
from worker.passes.pipelines import FixedPoint, Step, pass_names
from worker.passes.registry import REGISTRY, PassRegistry

Progress = Callable[[int, int, str], None]


class Instrument(Protocol):
    """Hooks around every pass run (tracing dumps, IR verification in tests); no pass contains such code."""

    def before_pass(self, ctx: PassContext, pass_: Pass) -> None: ...

    def after_pass(self, ctx: PassContext, pass_: Pass, entry: dict[str, Any]) -> None: ...


class PassManager:
    def __init__(self, registry: PassRegistry = REGISTRY, instruments: Iterable[Instrument] = (),
                 progress: Progress | None = None):
        self.registry = registry
        self.instruments = list(instruments)
        self.progress = progress
        self.trace: list[dict[str, Any]] = []
        self._order: dict[str, int] = {}

    def skip_reason(self, pass_: Pass, ctx: PassContext) -> str | None:
        info, options, targets = pass_.info, ctx.options, ctx.places.targets
        if info.name in options.disabled_passes:
            return "disabled by the user"
        if info.level > options.opt_level:
            return f"needs opt level {info.level}, the run asked for {options.opt_level}"
        if options.portable and not info.portable:
            return "emits ops of the mirserve domain, and the run asked for portable (standard ONNX) output"
        if info.targets is not None and not info.targets & targets:
            return (f"bound to target(s) {', '.join(sorted(info.targets))}, none of which is a valid place "
                    f"({', '.join(sorted(targets))})")
        excluded = info.excluded_targets & targets
        if excluded:
            return f"excluded on target(s) {', '.join(sorted(excluded))}, which are valid places"
        for op_type, domain in info.kernels:
            if ctx.kernels is None or not ctx.kernels.has_kernel(op_type, domain, targets):
                kind = f"{domain}.{op_type}" if domain else op_type
                return f"needs a {kind} kernel, which no valid target ({', '.join(sorted(targets))}) registers"
        return None

    def run(self, ctx: PassContext, steps: Sequence[Step]) -> list[dict[str, Any]]:
        """Run the steps in order; returns (and keeps in ``self.trace``) the trace entries."""
        names = pass_names(steps)
        self._order = {name: i for i, name in enumerate(names, start=1)}
        for name in names:
            if name not in self.registry:
                raise PassError(f"the pipeline names pass {name!r}, which is not registered")
        for step in steps:
            if isinstance(step, FixedPoint):
                self._run_fixed_point(ctx, step)
            else:
                self._run_one(ctx, self.registry.get(step))
        return self.trace

    def _run_fixed_point(self, ctx: PassContext, group: FixedPoint) -> None:
        started = time.perf_counter()
        total = iterations = 0
        converged = False
        while iterations < group.max_iterations:
            iterations += 1
            rewrites = 0
            for name in group.steps:
                entry = self._run_one(ctx, self.registry.get(name), iteration=iterations)
                rewrites += entry["rewrites"]
            total += rewrites
            if rewrites == 0:
                converged = True
                break
        self.trace.append({
            "pass": group.name, "kind": "fixed_point", "origin": "built-in",
            "seconds": round(time.perf_counter() - started, 6), "skipped": None, "rewrites": total,
            "iterations": iterations, "converged": converged, "max_iterations": group.max_iterations,
        })

    def _run_one(self, ctx: PassContext, pass_: Pass, iteration: int | None = None) -> dict[str, Any]:
        graph = ctx.graph
        entry: dict[str, Any] = {
            "pass": pass_.name, "kind": pass_.info.kind.value, "origin": pass_.info.origin,
            "seconds": 0.0, "skipped": None, "nodes_before": len(graph), "values_before": graph.value_count,
            "rewrites": 0, "details": [],
        }
        if iteration is not None:
            entry["iteration"] = iteration
        reason = self.skip_reason(pass_, ctx)
        if reason is not None:
            entry.update(skipped=reason, nodes_after=len(graph), values_after=graph.value_count)
            if iteration is None or iteration == 1:
                self.trace.append(entry)
            return entry
        if self.progress is not None:
            self.progress(self._order.get(pass_.name, 0), len(self._order), pass_.name)
        for instrument in self.instruments:
            instrument.before_pass(ctx, pass_)
        started = time.perf_counter()
        try:
            result = pass_.run(ctx) or PassResult()
            if pass_.info.kind is PassKind.PROGRAM and result.rewrites:
                for body in list(graph.all_graphs()):
                    body.toposort()
        except MirserveError:
            raise
        except Exception as exc:  # a bug in a pass: say which pass, keep the cause for --debug
            raise PassError(f"pass {pass_.name!r} failed: {type(exc).__name__}: {exc}") from exc
        entry["seconds"] = round(time.perf_counter() - started, 6)
        entry.update(nodes_after=len(graph), values_after=graph.value_count, rewrites=result.rewrites,
                     details=result.details)
        if result.refusals:
            entry["refusals"] = dict(result.refusals.most_common())
        entry.update(result.data)
        self.trace.append(entry)
        for instrument in self.instruments:
            instrument.after_pass(ctx, pass_, entry)
        return entry
