"""Runs a pipeline: decides which passes apply, runs them, and records a trace entry for each.

Skip rules (``skip_reason``), checked in this order (the first that holds is the recorded reason): disabled
by the user; opt level above the requested one; emits own-domain ops under --portable; bound targets not
among the valid places; an excluded target among them; a bound kernel registered for no valid target.

Analyses. A pass that rewrote something leaves stale what its ``PassInfo.invalidates`` names, unless its
result says it preserved it. The manager restores a stale analysis itself, so no pass runs another: the
topological order right after the pass (a sort is cheap, and instruments and the writer need it), the types
just before the next pass that requires them, by running the ``type_inference`` pass as a traced step of its
own (its entry says which pass needed it and which one left the types stale).

Passes that fail soft. Each pass runs inside an edit journal (worker.engine.ir.journal). A pass that raises
something other than a user error (``MirserveError``) has its edits undone, so the model is exactly as it was
before it ran; its trace entry says ``failed`` (the exception, the node it was at, the line), the run warns
and goes on without it (it does not run again in this run), and verification checks what comes out. With
the ``strict`` option such a failure fails the run instead (the test suite runs strict).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Protocol, Sequence

from worker.engine.errors import MirserveError, PassError
from worker.engine.ir.journal import Journal, hooks as journal_hooks
from worker.engine.passes.base import Analysis, Pass, PassContext, PassInfo, PassResult
from worker.engine.passes.failures import PassFailure, describe
from worker.engine.passes.pipelines import FixedPoint, Step, pass_names
from worker.engine.passes.registry import REGISTRY, PassRegistry

Progress = Callable[[int, int, str], None]
#: The pass that restores each analysis restored by running a pass.
TYPE_INFERENCE = "type_inference"


def skip_reason(info: PassInfo, ctx: PassContext) -> str | None:
    """Why a pass (or a plugin filter, which skips by the same rules) does not run here, or None."""
    options, targets = ctx.options, ctx.places.targets
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
        self._started = time.perf_counter()  # trace entries say when they started, relative to this
        self._order: dict[str, int] = {}
        #: Stale analyses, each with the pass that left it stale.
        self._stale: dict[Analysis, str] = {}
        #: Passes that failed (and were undone) in this run, in order.
        self.failures: list[PassFailure] = []
        #: Fixed-point groups that stopped at their iteration cap while still rewriting, with the passes that
        #: rewrote in the last iteration (two rewrites undoing each other, or one that never stops).
        self.unconverged: list[dict[str, Any]] = []

    def run(self, ctx: PassContext, steps: Sequence[Step], *, start: int = 0,
            stop: int | None = None) -> list[dict[str, Any]]:
        """Run the steps in order; returns (and keeps in ``self.trace``) the trace entries.

        ``start`` and ``stop`` run ``steps[start:stop]`` only, as part of the whole pipeline (the passes still
        see all of it planned): a run that stops short leaves stale types for the rest, which a ``fork`` of
        this manager runs from ``start=stop``."""
        names = pass_names(steps)
        self._order = {name: i for i, name in enumerate(names, start=1)}
        if start == 0:
            ctx.planned_passes = (*ctx.planned_passes, *names)
        for name in names:
            if name not in self.registry:
                raise PassError(f"the pipeline names pass {name!r}, which is not registered")
        with journal_hooks():  # once per run: each pass opens a journal of its own
            for step in steps[start:stop]:
                if isinstance(step, FixedPoint):
                    self._run_fixed_point(ctx, step)
                else:
                    self._run_one(ctx, self.registry.get(step))
            if stop is None:
                self._restore_types(ctx, None, None)  # the written model carries types too
        return self.trace

    def fork(self) -> "PassManager":
        """A manager that goes on from where this one stopped (its trace so far, stale analyses, failures), for
        the rest of a pipeline run more than once on the same start (``run(start=...)``)."""
        forked = PassManager(self.registry, self.instruments, self.progress)
        forked.trace, forked._started = list(self.trace), self._started
        forked._stale, forked.failures = dict(self._stale), list(self.failures)
        forked.unconverged = list(self.unconverged)
        return forked

    def _offset(self, moment: float) -> float:
        return round(moment - self._started, 6)

    def _run_fixed_point(self, ctx: PassContext, group: FixedPoint) -> None:
        started = time.perf_counter()
        total = iterations = 0
        converged = False
        while iterations < group.max_iterations:
            iterations += 1
            rewrites, rewriting = 0, []
            for name in group.steps:
                entry = self._run_one(ctx, self.registry.get(name), iteration=iterations)
                rewrites += entry["rewrites"]
                if entry["rewrites"]:
                    rewriting.append(name)
            total += rewrites
            if rewrites == 0:
                converged = True
                break
        self.trace.append({
            "pass": group.name, "kind": "fixed_point", "origin": "built-in", "start": self._offset(started),
            "seconds": round(time.perf_counter() - started, 6), "skipped": None, "rewrites": total,
            "iterations": iterations, "converged": converged, "max_iterations": group.max_iterations,
        })
        if not converged:
            self.unconverged.append({"group": group.name, "iterations": iterations, "passes": rewriting})

    def warnings(self) -> list[dict[str, Any]]:
        """The run's warnings for the report: passes that failed soft, groups that did not converge."""
        found = [{"kind": "pass_failed", "pass": f.pass_name, "message": f.message, **f.to_dict()}
                 for f in self.failures]
        for group in self.unconverged:
            found.append({"kind": "not_converged", **group, "message": (
                f"the passes {', '.join(group['passes'])} were still rewriting after {group['iterations']} "
                f"iterations of {group['group']}, where the group stops: the model is valid, but some rewrites "
                f"may be undoing each other")})
        return found

    def _restore_types(self, ctx: PassContext, pass_: Pass | None, iteration: int | None) -> None:
        """Run type inference before ``pass_`` (None: the end of the run) if it requires types and an earlier
        pass left them stale."""
        stale_after = self._stale.get(Analysis.TYPES)
        if stale_after is None or (pass_ is not None and (Analysis.TYPES not in pass_.info.requires
                                                          or pass_.name == TYPE_INFERENCE)):
            return
        del self._stale[Analysis.TYPES]
        if TYPE_INFERENCE in self.registry:
            required_by = pass_.name if pass_ is not None else "the end of the run"
            self._run_one(ctx, self.registry.get(TYPE_INFERENCE), iteration, cause=(required_by, stale_after))

    def _invalidate(self, ctx: PassContext, pass_: Pass, result: PassResult) -> None:
        """Mark what the pass left stale; restore the order at once."""
        if pass_.name == TYPE_INFERENCE:
            self._stale.pop(Analysis.TYPES, None)
        if not result.rewrites:
            return
        for analysis in (pass_.info.invalidates | result.invalidated) - result.preserved:
            self._stale[analysis] = pass_.name
        if self._stale.pop(Analysis.ORDER, None) is not None:
            for body in list(ctx.graph.all_graphs()):
                body.toposort()

    def _failed_before(self, pass_: Pass) -> str | None:
        if any(f.pass_name == pass_.name for f in self.failures):
            return "failed earlier in this run (see its failed entry); the run goes on without it"
        return None

    def _run_journaled(self, ctx: PassContext, pass_: Pass, entry: dict[str, Any]) -> PassResult | None:
        """Run the pass in an edit journal; None when it failed soft (its edits undone, ``entry`` says why)."""
        journal = Journal(ctx.model)
        report, fetch_places, widened = dict(ctx.report), dict(ctx.fetch_places), set(ctx.widened)
        try:
            with journal:
                return pass_.run(ctx) or PassResult()
        except (MirserveError, MemoryError):
            raise
        except Exception as exc:  # a bug in a pass or a plugin, or a model it was not written for
            failure = describe(pass_.name, pass_.info.origin, exc, journal.last_node)
            if ctx.options.strict:
                raise PassError(failure.message) from exc
            journal.rollback()
            ctx.report.clear()
            ctx.report.update(report)
            ctx.fetch_places.clear()
            ctx.fetch_places.update(fetch_places)
            ctx.widened.clear()
            ctx.widened.update(widened)
            self.failures.append(failure)
            entry["failed"] = failure.to_dict()
            return None

    def _run_one(self, ctx: PassContext, pass_: Pass, iteration: int | None = None,
                 cause: tuple[str, str] | None = None) -> dict[str, Any]:
        graph = ctx.graph
        entry: dict[str, Any] = {
            "pass": pass_.name, "kind": pass_.info.kind.value, "origin": pass_.info.origin,
            "start": self._offset(time.perf_counter()), "seconds": 0.0, "skipped": None,
            "nodes_before": len(graph), "values_before": graph.value_count, "rewrites": 0, "details": [],
        }
        if iteration is not None:
            entry["iteration"] = iteration
        reason = skip_reason(pass_.info, ctx) or self._failed_before(pass_)
        if reason is not None:
            entry.update(skipped=reason, nodes_after=len(graph), values_after=graph.value_count)
            if iteration is None or iteration == 1:
                self.trace.append(entry)
            return entry
        self._restore_types(ctx, pass_, iteration)
        if self.progress is not None and cause is None:
            self.progress(self._order.get(pass_.name, 0), len(self._order), pass_.name)
        for instrument in self.instruments:
            instrument.before_pass(ctx, pass_)
        started = time.perf_counter()
        entry["start"] = self._offset(started)
        result = self._run_journaled(ctx, pass_, entry)
        ctx.model.release_pages()  # what the pass read of mapped weights leaves the resident set
        if result is None:  # failed and undone: instruments still see the graph (as it was before the pass)
            entry.update(seconds=round(time.perf_counter() - started, 6), nodes_after=len(graph),
                         values_after=graph.value_count)
            self.trace.append(entry)
            for instrument in self.instruments:
                instrument.after_pass(ctx, pass_, entry)
            return entry
        self._invalidate(ctx, pass_, result)
        entry["seconds"] = round(time.perf_counter() - started, 6)
        entry.update(nodes_after=len(graph), values_after=graph.value_count, rewrites=result.rewrites,
                     details=result.details)
        if result.refusals:
            entry["refusals"] = dict(result.refusals.most_common())
        entry.update(result.data)
        if cause is not None:
            entry.update(required_by=cause[0], stale_after=cause[1])
        self.trace.append(entry)
        for instrument in self.instruments:
            instrument.after_pass(ctx, pass_, entry)
        return entry
