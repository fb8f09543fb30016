"""The engine's one entry point: model path, places, options, progress callback -> optimized model, report.

The CLI and the service's job runner both call ``optimize``; neither reaches deeper into the engine. The
job side and the service import this module and ``worker.engine.errors`` only (a test checks it), so what
they need besides ``optimize`` is here too: the listings, the command line to extend, and child processes
that die with their parent.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Mapping

from worker import __version__
from worker.engine.children import die_with_parent
from worker.engine.cli import (add_option_arguments, add_output_arguments, add_picture_arguments,
                               add_plugin_argument, build_parser, check_picture_targets, options_from_args,
                               print_outcome, write_pictures)
from worker.engine.cli import main as run_cli
from worker.engine.errors import OptionsError, VerificationError
from worker.engine.ir import load_model, save_model
from worker.engine.ir.functions import qualified
from worker.engine.numeric import (DEFAULT_ATOL, DEFAULT_RTOL, FP16_ATOL, FP16_RTOL, choose_shapes, save_stored_in_fp16,
                                   verify)
from worker.engine.memory import formulas
from worker.engine.sample_shapes import first_choice, graph_specs, has_open_dims
from worker.engine.sample_values import steering_values
from worker.engine.options import OptimizeOptions
from worker.engine.pinned_builds import PinnedBuilds
from worker.engine.passes import REGISTRY, PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.passes.support.casts import widens_fp16
from worker.engine.passes.pipelines import (CHAINS, DOMAIN_FUSE, FUSE, MEMORY, PLACE, REPLACE, all_pipelines,
                                            get_pipeline, pass_names)
from worker.engine.passes.place.support_check import KERNEL_PICK, kernel_pick_will_run, placement_support
from worker.engine.kernels import KernelTable, default_table
from worker.engine.kernels.ops import NHWC_PREFIX
from worker.engine.kernels.pick import CAST_OPS, first_place
from worker.engine.places import REDUCED_PRECISIONS, Precision, ValidPlaces, all_targets, parse_places
from worker.engine.plugins import catalog
from worker.engine.plugins.loader import PLUGINS
from worker.engine.memory.timeline_svg import render_timeline
from worker.engine.summary import build_summary, op_type_counts, render_summary, render_table
from worker.engine.trace_events import chrome_trace
from worker.engine.trace_svg import render_trace

__all__ = ["__version__", "add_option_arguments", "add_output_arguments", "add_picture_arguments",
           "add_plugin_argument", "build_parser", "check_picture_targets", "chrome_trace", "die_with_parent",
           "draw_command", "list_all", "list_filters", "list_passes", "list_pipelines", "list_plugins",
           "list_targets", "memory_at", "optimize", "OptimizeOptions", "options_from_args", "OptionsError",
           "print_outcome", "render_summary", "render_table", "render_timeline", "render_trace", "run_cli",
           "validate_options", "write_pictures"]

Progress = Callable[[int, int, str], None]


def validate_options(options: OptimizeOptions) -> ValidPlaces:
    """Every check that needs no model: types and ranges, places, pipeline, pass and filter names.

    Plugins are loaded first; a name missing because its plugin failed to load fails with that plugin's error.
    """
    options.check_types()
    PLUGINS.ensure_loaded()  # before the places: a plugin may add a target
    places = parse_places(options.places, host_fallback=options.host_fallback)
    catalog.check_options(options)
    return places


def functions_no_place_runs(kernels: KernelTable, places: ValidPlaces) -> Callable[[str, str], bool]:
    """Chooses the model-local functions whose calls the loader replaces by their bodies: those no kernel of
    a valid place runs (onnxruntime, too, inlines a function that no execution provider takes). A function
    some place has a kernel for (an op of the mirserve domain, a plugin's op) stays one node, but for what an
    earlier run's placement made (in a model mirserve optimized before): its casts and its NHWC forms, which
    read and write NHWC tensors no standard op does. This run plans its own, so theirs become the Cast and
    Transposes they compute, for the rewrites to cancel or keep."""
    def runs_nowhere(domain: str, name: str) -> bool:
        if domain == "mirserve" and (name in CAST_OPS or name.startswith(NHWC_PREFIX)):
            return True
        return not any(first_place(k, places) is not None
                       for k in kernels.kernels(name, domain, targets=places.targets))
    return runs_nowhere


def tolerances(options: OptimizeOptions, places: ValidPlaces, widens_fp16: bool = False) -> tuple[float, float]:
    """The user's tolerances, or defaults: looser when any place or the weights are fp16, or when the optimized
    model computes in fp32 values the input computed in fp16 (``widens_fp16``: fp32 places on an fp16 model;
    the input's outputs then carry fp16's rounding, the optimized model's do not)."""
    half = options.fp16_storage or widens_fp16 or any(p.precision is Precision.FP16 for p in places)
    rtol, atol = (FP16_RTOL, FP16_ATOL) if half else (DEFAULT_RTOL, DEFAULT_ATOL)
    return (options.rtol if options.rtol is not None else rtol,
            options.atol if options.atol is not None else atol)


def optimize(model_path: str | os.PathLike, output_path: str | os.PathLike | None,
             options: OptimizeOptions = OptimizeOptions(), progress: Progress | None = None, *,
             external_data_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Optimize the model at ``model_path`` into ``output_path`` and return the report.

    The output appears only once it is complete and (unless ``options.verify`` is off) verified. With
    ``options.check_support_only`` nothing is written (``output_path`` may be None): the pipeline runs up to
    kernel pick and the report's ``support`` section tells, per op type, where it will run or why nowhere.
    ``external_data_dir`` is where the model's external data may be read from; give it only for a model
    you trust (the command line gives a local model's own directory); without it, a model that names
    external data anywhere is refused. Raises a MirserveError subclass for anything the user can fix.
    """
    started = time.perf_counter()
    places = validate_options(options)
    model_path = Path(model_path)
    if output_path is None and not options.check_support_only:
        raise OptionsError("an output path is needed (only a support check writes nothing)", field="output")
    output_path = Path(output_path) if output_path is not None else None
    directory = (output_path.parent if output_path is not None and str(output_path.parent) else Path("."))
    if output_path is not None and not options.check_support_only and not directory.is_dir():
        raise OptionsError(f"{output_path}: the output directory {directory} does not exist", field="output")
    limits = options.limits
    kernels = default_table()
    inline = functions_no_place_runs(kernels, places)
    model = load_model(model_path, external_data_dir=external_data_dir, limits=limits,
                       target_opset=options.target_opset, inline=inline)
    apply_input_shapes(model.graph, options.input_shapes)
    before = {"path": str(model_path), "nodes": len(model.graph), "bytes": model_path.stat().st_size,
              "op_types": op_type_counts(model.graph),
              # what If/Loop/Scan bodies hold: an op there was not made by a rewrite
              "op_types_in_bodies": op_type_counts(n for g in model.graph.all_graphs() if g is not model.graph
                                                   for n in g)}
    if model.inlined_functions:  # calls no valid place runs, replaced by the functions' bodies on load
        before["inlined_functions"] = {qualified(key): n for key, n in model.inlined_functions.items()}
    inlined = sorted({(domain, name) for domain, name, _ in model.inlined_functions})
    input_bytes = before["bytes"] + model.external_data_bytes  # the weights in external data count too
    ctx = PassContext(model=model, options=options, places=places, kernels=kernels, input_bytes=input_bytes)
    manager = PassManager(progress=progress)
    if options.check_support_only:
        return _support_report(ctx, manager, before, places, started)
    cut = bool(options.cut_start or options.cut_end)
    # Shapes for open input dims, chosen on the input model before the pipeline, so the memory plan plans at
    # them; a cut model's inputs are other values, for which verification chooses its own.
    chunk_bytes = verify_chunk_bytes(input_bytes, limits)
    steering = {} if cut else steering_values(model.graph)  # read before the pipeline folds a comparison away
    ctx.sample_shapes = None if cut else sample_input_shapes(model, model_path, options, chunk_bytes=chunk_bytes,
                                                             mapped_bytes=input_bytes, by_regions=bool(chunk_bytes),
                                                             values=steering)
    with _cut_first(ctx, manager, model_path, directory) as (cut_steps, reference):
        steps = (*cut_steps, *get_pipeline(options.pipeline).steps_for(options))
        trace = manager.run(ctx, steps)
        rtol, atol = tolerances(options, places, widens_fp16(ctx.model.graph))
        verification: dict[str, Any] | None = None
        # A cut model has the start values for inputs: the shapes given for inputs it lost do not apply.
        shapes = {k: v for k, v in options.input_shapes.items() if model.graph.value(k) is not None
                  and model.graph.value(k).is_graph_input}

        def check(candidate: Path) -> None:
            nonlocal verification
            if options.verify:
                shape_sets = ctx.sample_shapes["shapes"] if ctx.sample_shapes else None
                data = output_path.with_name(output_path.name + ".data")
                mapped = input_bytes + candidate.stat().st_size + (data.stat().st_size if data.exists() else 0)
                # a large model is compared where it differs from the input (a cut one is not the input)
                same = untouched_weights(model.graph) if chunk_bytes and not cut else None
                verification = verify(str(reference), str(candidate), input_shapes=shapes,
                                      shape_sets=shape_sets, runs=options.verify_runs, rtol=rtol, atol=atol,
                                      timeout=limits.verify_seconds, memory_mb=limits.verify_memory_mb,
                                      chunk_bytes=chunk_bytes, mapped_bytes=mapped, same_weights=same,
                                      shapes_checked=bool((ctx.sample_shapes or {}).get("checked", True)),
                                      values=steering, reference_inline=inlined)
                if chunk_bytes:
                    verification["pieces_of_mb"] = chunk_bytes >> 20
                if verification["passed"] is None and not options.allow_unverified:
                    raise VerificationError(
                        f"the optimized model cannot be verified, so it is not written: "
                        f"{verification.get('skipped')}. Fix the model, or ask for it unverified with "
                        f"--allow-unverified (option allow_unverified)")
                if ctx.sample_shapes and ctx.sample_shapes["dims"]:
                    verification.update(dims=ctx.sample_shapes["dims"], roles=ctx.sample_shapes["roles"],
                                        tried=ctx.sample_shapes["tried"])

        verify_args = dict(input_shapes=shapes, shape_sets=ctx.sample_shapes["shapes"] if ctx.sample_shapes
                           else None, runs=options.verify_runs, rtol=rtol, atol=atol,
                           timeout=limits.verify_seconds, memory_mb=limits.verify_memory_mb, values=steering,
                           reference_inline=inlined)

        def reload(run_options: OptimizeOptions, pinned=frozenset(), kept=frozenset()) -> PassContext:
            """The input loaded again, to be built under ``run_options`` (nodes named in ``pinned`` in fp32,
            weights named in ``kept`` not stored in fp16)."""
            again = load_model(model_path, external_data_dir=external_data_dir, limits=limits,
                               target_opset=options.target_opset, inline=inline)
            apply_input_shapes(again.graph, options.input_shapes)
            rebuilt = PassContext(model=again, options=run_options, places=places, kernels=ctx.kernels,
                                  input_bytes=input_bytes, pinned_fp32=frozenset(pinned),
                                  kept_fp32_weights=frozenset(kept))
            rebuilt.sample_shapes = ctx.sample_shapes
            return rebuilt

        def rebuild(run_options: OptimizeOptions) -> tuple:
            """The input built again under ``run_options``: (model, ctx, trace, manager)."""
            rebuilt = reload(run_options)
            again_manager = PassManager()
            run_steps = get_pipeline(run_options.pipeline).steps_for(run_options)
            return rebuilt.model, rebuilt, again_manager.run(rebuilt, run_steps), again_manager

        def _with_fp32_nodes(exc: VerificationError) -> tuple:
            if not amp_fits(input_bytes, limits):  # it runs both models whole, every value an output
                raise VerificationError(f"{exc}. Auto mixed precision runs both models whole, and "
                                        f"{input_bytes >> 20} MiB of weights leave too little of the "
                                        f"verification's {limits.verify_memory_mb} MiB for that; give an fp32 "
                                        f"place instead, or raise --limit verify_memory_mb") from None
            builds = PinnedBuilds(lambda names: reload(options, names), steps)
            fallback, pinned = fall_back(model, str(exc), reference, directory, builds, verify_args)
            if pinned is None:
                raise VerificationError(f"{exc} {fallback['refusal']}") from None
            pinned[1].report["precision_fallback"] = fallback
            return pinned

        def _with_fp32_weights(exc: VerificationError) -> tuple:
            if not amp_fits(input_bytes, limits):
                raise VerificationError(f"{exc}. Finding the weights to keep in fp32 runs both models whole, and "
                                        f"{input_bytes >> 20} MiB of weights leave too little of the "
                                        f"verification's {limits.verify_memory_mb} MiB for that; leave out "
                                        f"--fp16-storage, or raise --limit verify_memory_mb") from None
            builds = PinnedBuilds(lambda names: reload(options, kept=names), steps, pins="kept_fp32_weights")
            section, kept = storage_fallback(model, ctx, str(exc), reference, directory, builds, verify_args)
            if kept is None:
                raise VerificationError(f"{exc} {section['refusal']}") from None
            kept[1].report["storage_fallback"] = section
            return kept

        def _without_rewrites(exc: VerificationError) -> tuple:
            section, rebuilt = rewrite_fallback(
                steps, str(exc), reference, directory,
                lambda names: rebuild(dataclasses.replace(options, disabled_passes=(*options.disabled_passes,
                                                                                    *names))), verify_args)
            if rebuilt is None:
                raise VerificationError(f"{exc} {section['refusal']}") from None
            rebuilt[1].report["rewrite_fallback"] = section
            return rebuilt

        limits.check_output(sum(v.nbytes for g in model.graph.all_graphs() for v in g.initializers.values()),
                            input_bytes)
        try:
            saved = save_model(model, output_path, check=check)
        except VerificationError as exc:
            if _falls_back(options, places, exc):
                model, ctx, trace, manager = _with_fp32_nodes(exc)
            elif _storage_falls_back(options, exc, ctx):
                model, ctx, trace, manager = _with_fp32_weights(exc)
            elif _rewrites_fall_back(options, exc, cut) and amp_fits(input_bytes, limits):
                model, ctx, trace, manager = _without_rewrites(exc)
            else:
                raise
            # Each fallback's search verified its builds whole (``verify_args``: both models fit, ``amp_fits``),
            # comparing the outputs; the build it settled on is checked the same way. By regions, the check would
            # compare inner values the search never saw, and fail a build whose outputs verify (an fp16 value
            # near 0 inside a ViT, 0.0015 off where the logits are within tolerance).
            chunk_bytes = 0
            saved = save_model(model, output_path, check=check)
    report: dict[str, Any] = {
        "version": __version__,
        "model": {"input": before, "output": {"path": str(output_path), "nodes": len(model.graph),
                                              "bytes": saved.bytes, "op_types": op_type_counts(model.graph),
                                              "external_data": str(saved.external_data) if saved.external_data
                                              else None}},
        "places": [str(p) for p in places],
        "pipeline": options.pipeline,
        "options": options.to_dict(),
        "limits": limits.to_dict(),
        "trace": trace,
        "verification": verification,
        "memory": None,  # filled by the memory_plan pass when the pipeline runs it
        "plugins": catalog.list_plugins(),
        "warnings": manager.warnings(),
    }
    report.update(ctx.report)
    if report.get("rewrite_fallback"):
        turned_off = report["rewrite_fallback"]["passes"]
        report["warnings"].append({"kind": "rewrite_fallback", "passes": turned_off, "message": (
            f"{', '.join(turned_off)} turned off: with {'it' if len(turned_off) == 1 else 'them'} the output did "
            f"not verify ({report['rewrite_fallback']['failure']}); --strict fails the run instead")})
    report["seconds"] = round(time.perf_counter() - started, 3)
    report["summary"] = build_summary(report, has_kernel=lambda op, target: _has_kernel(ctx.kernels, op, target))
    return report


def _falls_back(options: OptimizeOptions, places: ValidPlaces, exc: VerificationError) -> bool:
    """Auto mixed precision applies: asked for, a place computes in fp16 or int8, the models ran and differ."""
    return (options.precision_fallback and getattr(exc, "mismatch", None) is not None
            and any(p.precision in REDUCED_PRECISIONS for p in places))


def fall_back(model, failure: str, reference: Path, directory: Path, build: Callable,
              verify_args: dict[str, Any]) -> tuple[dict[str, Any], tuple | None]:
    """Auto mixed precision (``worker.engine.amp``) for a built ``model`` that failed verification with
    ``failure``: the report section and the rebuilt (model, ctx, trace, manager) with the fewest nodes pinned
    to fp32 that verifies, or None (the section's ``refusal`` says why)."""
    from worker.engine import amp

    started = time.perf_counter()
    section: dict[str, Any] = {"failure": failure, "nodes": [], "runs": 0, "ranked": 0}
    with tempfile.TemporaryDirectory(prefix=".mirserve-amp-", dir=directory) as scratch:
        try:
            errors, beyond = traced_errors(model, reference, Path(scratch) / "fp16.onnx", verify_args)
        except VerificationError as exc:
            section["refusal"] = f"Auto mixed precision could not trace the error: {exc}"
            return section, None
        order = amp.rank(model.graph, errors, beyond)
        section["ranked"] = len(order)
        if not order:
            section["refusal"] = ("No node computes in fp16, or in int8 where the input model computed in float, so "
                                  "auto mixed precision has nothing to move to fp32.")
            return section, None

        outcome, rebuilt = search_rebuilds(order, build, reference, Path(scratch), verify_args)
    section.update(runs=outcome.runs, steps=outcome.steps, seconds=round(time.perf_counter() - started, 3),
                   placement_only=[r.node for r in outcome.unneeded], unpinning_stopped=outcome.stopped)
    if not outcome.passed:
        section["refusal"] = (f"Auto mixed precision moved all {len(order)} nodes that compute in fp16 or int8 to fp32 "
                              f"places, and the output still does not verify: {outcome.steps[-1]['found']}"
                              if outcome.steps else "Auto mixed precision found nothing to try.")
        return section, None
    from worker.engine.passes.place.type_layout_cast import picked_name

    nodes = {picked_name(n): n for n in rebuilt[0].graph}
    section["precisions"] = sorted({item.precision for item in outcome.pinned})
    for item in outcome.pinned:
        node = nodes.get(item.node)
        place = str(node.pick.place) if node is not None and getattr(node, "pick", None) is not None else None
        section["nodes"].append({"node": item.node, "op": item.op, "place": place, "growth": _finite(item.growth),
                                 "error": _finite(item.error),
                                 "why": amp.describe(item, untried=item in outcome.untried)})
    return section, rebuilt


def _storage_falls_back(options: OptimizeOptions, exc: VerificationError, ctx: PassContext) -> bool:
    """The storage fallback applies: asked for (precision_fallback), fp16_storage stored weights, the models
    ran and differ."""
    return (options.precision_fallback and options.fp16_storage and bool(ctx.stored_half)
            and getattr(exc, "mismatch", None) is not None)


def storage_fallback(model, ctx: PassContext, failure: str, reference: Path, directory: Path, build: Callable,
                     verify_args: dict[str, Any]) -> tuple[dict[str, Any], tuple | None]:
    """For a model whose weights fp16_storage stored in fp16 and that failed verification with ``failure``:
    the fewest weights to keep in fp32 for the output to verify, and the model rebuilt so, or None (the
    section's ``refusal`` says why). The search is auto mixed precision's (``amp.search``) over the stored
    weights, ranked by the error the nodes reading each add to what they were given (one traced run of both
    models, ``numeric.value_errors``): rounding a weight to fp16 is where a reader's error comes from."""
    from worker.engine import amp

    started = time.perf_counter()
    section: dict[str, Any] = {"failure": failure, "weights": [], "runs": 0, "ranked": 0}
    with tempfile.TemporaryDirectory(prefix=".mirserve-storage-", dir=directory) as scratch:
        try:
            errors, _ = traced_errors(model, reference, Path(scratch) / "stored.onnx", verify_args)
        except VerificationError as exc:
            section["refusal"] = f"The storage fallback could not trace the error: {exc}"
            return section, None
        order = amp.rank_weights(model.graph, ctx.stored_half, errors)
        section["ranked"] = len(order)
        outcome, rebuilt = search_rebuilds(order, build, reference, Path(scratch), verify_args)
    section.update(runs=outcome.runs, steps=outcome.steps, seconds=round(time.perf_counter() - started, 3))
    if not outcome.passed:
        section["refusal"] = (f"With all {len(order)} weights it stored in fp16 kept in fp32 the output still does "
                              f"not verify: {outcome.steps[-1]['found']}" if outcome.steps
                              else "The storage fallback found nothing to try.")
        return section, None
    section["weights"] = [{"weight": item.node, "growth": _finite(item.growth), "error": _finite(item.error),
                           "why": amp.describe_weight(item)} for item in outcome.pinned]
    return section, rebuilt


def _rewrites_fall_back(options: OptimizeOptions, exc: VerificationError, cut: bool) -> bool:
    """The rewrite fallback applies: the models ran and differ, the run may go on without a pass (not
    --strict), and the reference is the input (a cut model's is not rebuilt)."""
    return not options.strict and getattr(exc, "mismatch", None) is not None and not cut


#: Passes that are not a rewrite a model may go without: typing, placement, memory planning, plugin filters.
_REQUIRED_PASSES = frozenset({"type_inference", "support_check", "filter_pre", "filter_simplify", "filter_domain",
                              "filter_post", "cut_subgraph", *PLACE, *MEMORY})


def rewrite_fallback(steps, failure: str, reference: Path, directory: Path, build: Callable,
                     verify_args: dict[str, Any]) -> tuple[dict[str, Any], tuple | None]:
    """For a model that failed verification with fp32 places (``failure``): the fewest of the passes that
    rewrote it whose rewrites must go for the output to verify, and the model rebuilt without them, or None
    (the section's ``refusal`` says why). A rewrite that is exact in real arithmetic can still move a result
    past the tolerance where the model turns rounding into decisions (Mask R-CNN: folding BatchNorm into the
    convolutions moves a box by a fraction of a pixel, and a mask's border with it). The search is auto
    mixed precision's (``amp.search``) over passes instead of nodes: the fusions that change arithmetic
    first, the eliminations last. As a pass that fails is undone and the run goes on (``--strict`` fails it),
    so is a pass whose result does not verify."""
    from worker.engine import amp

    started = time.perf_counter()
    # every optional pass of the pipeline, not only those that rewrote: without conv_bn_fuse, simplify_inference
    # and conv_scale_fuse fold the same BatchNorms another way
    optional = [name for name in pass_names(steps) if name not in _REQUIRED_PASSES]
    first = [name for name in (*FUSE, *DOMAIN_FUSE, *CHAINS, *REPLACE) if name in optional]
    order = [amp.Ranked(name, "pass", 0.0, 0.0) for name in dict.fromkeys([*first, *optional])]
    section: dict[str, Any] = {"failure": failure, "passes": [], "runs": 0}
    if not order:
        section["refusal"] = "The pipeline has no rewrite pass to go without."
        return section, None
    with tempfile.TemporaryDirectory(prefix=".mirserve-rewrites-", dir=directory) as scratch:
        outcome, rebuilt = search_rebuilds(order, build, reference, Path(scratch), verify_args)
    section.update(runs=outcome.runs, steps=outcome.steps, seconds=round(time.perf_counter() - started, 3))
    if not outcome.passed:
        section["refusal"] = (f"Without all {len(order)} of its rewrite passes the output still does not verify: "
                              f"{outcome.steps[-1]['found']}" if outcome.steps else "No rebuild was tried.")
        return section, None
    section["passes"] = [item.node for item in outcome.pinned]
    return section, rebuilt


def search_rebuilds(order, build: Callable, reference: Path, scratch: Path,
                    verify_args: dict[str, Any]) -> tuple[Any, tuple | None]:
    """``amp.search`` over ``order`` where a step builds the model with the chosen items (``build(names)``:
    nodes kept in fp32, passes turned off) and verifies it against ``reference``; the outcome and the last
    build that verified (the search ends on it). As long as verification may take, spread over the steps.
    The reference runs at the first step only (``verify(expected=...)``). A build need only stay valid until
    the next (``PinnedBuilds`` reuses one model): when a step that did not verify came after it, the build
    that did is made again. ``unchanged`` compares builds by every node's kernel and place (``_placement_of``),
    each build's placement kept, so a set that verified is not built again to be compared."""
    from worker.engine import amp

    built: dict[str, Any] = {}
    placements: dict[frozenset, tuple] = {}

    def trial(names) -> tuple[bool, str]:
        attempt = build(names)
        built["latest"] = (list(names), attempt)
        placements[frozenset(names)] = _placement_of(attempt[0])
        candidate = scratch / "trial.onnx"
        stored = save_stored_in_fp16(attempt[0], candidate)  # the child loads it as it is
        try:  # the reference's outputs are the same at every step: run once, recorded in the scratch directory
            verify(str(reference), str(candidate), expected=str(scratch / "reference.npz"), candidate_stored=stored,
                   **verify_args)
        except VerificationError as exc:
            return False, str(exc)
        finally:
            candidate.unlink(missing_ok=True)
        built["verified"] = list(names)
        return True, "verified"

    def placement(names) -> tuple:
        if frozenset(names) not in placements:
            attempt = build(names)
            built["latest"] = (list(names), attempt)
            placements[frozenset(names)] = _placement_of(attempt[0])
        return placements[frozenset(names)]

    outcome = amp.search(order, trial, seconds=max(4 * float(verify_args["timeout"]), 60.0),
                         unchanged=lambda pins, fewer: placement(pins) == placement(fewer))
    if "verified" not in built:
        return outcome, None
    names, attempt = built["latest"]
    return outcome, attempt if names == built["verified"] else build(built["verified"])


def _placement_of(model) -> tuple:
    """Every node of the main graph with its kernel and place: two builds that agree are the same model."""
    return tuple((n.name, n.domain, n.op_type, tuple(sorted(n.metadata.items()))) for n in model.graph)


def traced_errors(model, reference: Path, path: Path, verify_args: dict) -> tuple:
    """The built ``model`` saved at ``path`` and traced against ``reference`` at the first shapes verification
    runs (``verify_errors``); raises VerificationError when the trace cannot run."""
    save_model(model, path)
    shape_sets = verify_args["shape_sets"]
    shapes = shape_sets[0] if shape_sets else _declared_shapes(model, verify_args["input_shapes"])
    return verify_errors(str(reference), str(path), shapes, verify_args)


def verify_errors(reference: str, candidate: str, shapes: Mapping[str, Any], verify_args: dict) -> tuple:
    """Each value's error (``numeric.value_errors``) and the input model's values beyond fp16's range."""
    from worker.engine.numeric import value_errors

    return value_errors(reference, candidate, shapes=shapes, rtol=verify_args["rtol"], atol=verify_args["atol"],
                        timeout=verify_args["timeout"], memory_mb=verify_args["memory_mb"],
                        values=verify_args.get("values"), with_range=True,
                        reference_inline=verify_args.get("reference_inline", ()))


def _declared_shapes(model, given: Mapping[str, Any]) -> dict[str, list[int]]:
    """The inputs' shapes: given, or declared (a dim left open: 1)."""
    shapes = {}
    for value in model.graph.inputs:
        if value.is_initializer:
            continue
        shapes[value.name] = list(given.get(value.name) or [d if isinstance(d, int) and d > 0 else 1
                                                            for d in (value.shape or ())])
    return shapes


def _finite(x: float) -> float | None:
    return None if x >= 1e29 else round(x, 3)


def memory_at(memory: Mapping[str, Any], dims: str) -> dict[str, Any]:
    """A report's memory figures at other sizes of its open input dims (``batch=8,seq=512``), from the formulas
    the memory plan fitted; raises OptionsError (field ``dims``) for dims the model does not have or lacks."""
    return formulas.memory_at(memory, dims)


#: Weights per piece when verification runs a large model piece by piece.
VERIFY_CHUNK_BYTES = 256 << 20


#: Auto mixed precision runs the input and a candidate whole, every value an output: onnxruntime holds both
#: models' weights (the candidate's partly in fp16) and the values; four times the input's weights is room.
AMP_MEMORY_FACTOR = 4


def amp_fits(input_bytes: int, limits) -> bool:
    """Whether auto mixed precision may run on a model of ``input_bytes`` within the verification's memory."""
    return not limits.verify_memory_mb or input_bytes * AMP_MEMORY_FACTOR <= limits.verify_memory_mb << 20


def verify_chunk_bytes(input_bytes: int, limits) -> int:
    """0 when verification loads both models whole (weights of at most one piece, or none to bound), else the
    weight bytes per piece it runs them in (``chunked``). Whole, onnxruntime holds a copy of both models'
    weights (BERT-base's 437 MB took the child to 1.2 GB); in pieces, the child holds one piece's weights,
    mapped, and is no slower (the pieces' sessions copy nothing)."""
    if input_bytes > VERIFY_CHUNK_BYTES:
        return min(VERIFY_CHUNK_BYTES, max(1, limits.verify_memory_mb << 20) // 4) if limits.verify_memory_mb \
            else VERIFY_CHUNK_BYTES
    return 0


def untouched_weights(graph) -> dict[str, tuple[str, int, int]]:
    """The weights the optimizer left as they were loaded, by where their bytes are in the input model's
    files (``regions.weight_key``): verification by regions need not compare them."""
    from worker.engine.regions import weight_key

    found = {}
    for value in graph.initializers.values():
        key = weight_key(value)
        if key is not None:
            found[value.name] = key
    return found


def sample_input_shapes(model, model_path: Path, options: OptimizeOptions, *, chunk_bytes: int = 0,
                        mapped_bytes: int = 0, by_regions: bool = False,
                        values: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Shapes for the input dims the user left open, or None when there are none: chosen by running the
    input model (``choose_shapes``) when verification is on, else the first choice untried. ``by_regions``:
    verification compares regions, which a run of the whole model would take longer than (the first choice
    and its batch-2 twin, untried; should the regions not do, verification chooses again on the whole)."""
    specs = graph_specs(model.graph)
    if not has_open_dims(specs, options.input_shapes):
        return None
    if options.verify and by_regions:
        return first_choice(specs, options.input_shapes, second_batch=True)
    if options.verify:
        chosen = choose_shapes(str(model_path), given=options.input_shapes, timeout=options.limits.verify_seconds,
                               memory_mb=options.limits.verify_memory_mb, chunk_bytes=chunk_bytes,
                               mapped_bytes=mapped_bytes, values=values)
        return chosen if chosen.get("shapes") else None
    try:
        return first_choice(specs, options.input_shapes)
    except ValueError:  # an input without a rank: nothing to sample
        return None


#: What runs before the pipeline when cut_start / cut_end are set: the cut needs the starts' types.
CUT_STEPS = ("type_inference", "cut_subgraph")


@contextmanager
def _cut_first(ctx: PassContext, manager: PassManager, model_path: Path, directory: Path):
    """Yields the steps that cut the model before the pipeline (none without cut_start / cut_end) and the
    model file the optimized one is verified against: the cut model, saved right after the cut, or the input."""
    if not ctx.options.cut_start and not ctx.options.cut_end:
        yield (), model_path
        return
    with tempfile.TemporaryDirectory(prefix=".mirserve-cut-", dir=directory) as scratch:
        reference = Path(scratch) / "cut.onnx"
        manager.instruments.append(_SaveAfter("cut_subgraph", reference))
        yield CUT_STEPS, reference


class _SaveAfter:
    """An instrument that saves the model as it is right after one pass."""

    def __init__(self, pass_name: str, path: Path):
        self.pass_name, self.path = pass_name, path

    def before_pass(self, ctx: PassContext, pass_) -> None:
        pass

    def after_pass(self, ctx: PassContext, pass_, entry: dict[str, Any]) -> None:
        if pass_.name == self.pass_name:
            save_model(ctx.model, self.path)


def draw_command(model: str | os.PathLike, output: str | os.PathLike, *, memory_limit_mb: int, max_nodes: int,
                 title: str) -> list[str]:
    """The command that draws a model's graph (``mirserve draw``) in a child process that limits its own
    address space first: for a model that came from an upload."""
    import sys

    return [sys.executable, "-m", "worker.engine.draw", str(model), "-o", str(output), "--title", title,
            "--memory-limit-mb", str(memory_limit_mb), "--max-nodes", str(max_nodes)]


def _has_kernel(kernels, qualified_op: str, target: str) -> bool:
    domain, _, op = qualified_op.rpartition(".")
    return kernels.has_kernel(op, domain, [target])


def _support_report(ctx: PassContext, manager: PassManager, before: dict, places: ValidPlaces,
                    started: float) -> dict[str, Any]:
    """--check-support: the pipeline up to kernel pick (the rewrites included, so the ops checked are the
    ones that will run), then per op type its places or why none; nothing is written. A pipeline without
    kernel pick (opt level 0, the analysis pipeline) is checked as it stands after its last pass."""
    steps = list(get_pipeline(ctx.options.pipeline).steps_for(ctx.options))
    names = pass_names(steps)
    if KERNEL_PICK in names:
        upto = names.index(KERNEL_PICK)
        steps = [s for s in steps if all(n in names[:upto + 1] for n in pass_names([s]))]
    if ctx.options.cut_start or ctx.options.cut_end:
        steps = [*CUT_STEPS, *steps]
    trace = manager.run(ctx, steps)
    before_rewrites = ctx.report.get("support")
    if kernel_pick_will_run(ctx):
        support = placement_support(ctx, ctx.report.get("pick_failures") or {}, before_rewrites)
    else:
        support = before_rewrites or {"places": [str(p) for p in places], "stage": "before_rewrites",
                                      "supported": True, "op_types": 0, "unsupported": []}
    return {"version": __version__, "model": {"input": before, "output": None},
            "places": [str(p) for p in places], "pipeline": ctx.options.pipeline, "options": ctx.options.to_dict(),
            "trace": trace, "verification": None, "support": support,
            "warnings": manager.warnings(),
            "seconds": round(time.perf_counter() - started, 3)}


def list_targets(op: str | None = None, target: str | None = None) -> list[dict[str, Any]]:
    """Every registered target with its memory, the source of its kernel table, and its kernels.

    ``op`` keeps only the kernels of that op (domain-qualified outside the default domain, as listed) and the
    targets that have one; ``target`` keeps only that target. An unknown target is an OptionsError.
    """
    PLUGINS.ensure_loaded()
    table = default_table()
    chosen = all_targets()
    if target is not None:
        names = [t.name for t in chosen]
        if target not in names:
            raise OptionsError(f"unknown target {target!r}: the targets are {', '.join(names)}", field="target")
        chosen = [t for t in chosen if t.name == target]
    found = []
    for each in chosen:
        kernels = sorted(table.by_target(each.name), key=lambda k: (k.domain, k.op, k.since))
        if op is not None:
            kernels = [k for k in kernels if k.qualified_op == op]
            if not kernels and target is None:
                continue
        found.append({"name": each.name, "memory_space": each.memory_space,
                      "description": each.description, "origin": each.origin,
                      "source": table.source(each.name),
                      "kernels": [{"id": k.id, "op": k.qualified_op, "since": k.since, "until": k.until,
                                   "precision": k.precision.value, "layout": k.layout.value,
                                   "variant": k.variant or None, "origin": k.origin} for k in kernels]})
    return found


def list_passes() -> list[dict[str, Any]]:
    """Every registered pass with its metadata and its position in the default pipeline (1-based)."""
    PLUGINS.ensure_loaded()
    default = get_pipeline("default")
    order = {name: i for i, name in enumerate(pass_names(default.steps), start=1)}
    return [{**p.info.to_dict(), "position": order.get(p.name)} for p in REGISTRY]


def list_pipelines() -> list[dict[str, Any]]:
    PLUGINS.ensure_loaded()
    return [p.to_dict() for p in all_pipelines()]


def list_filters() -> list[dict[str, Any]]:
    """Plugin filters in run order, then pre- and post-callbacks, each with its origin and stage."""
    return catalog.list_filters()


def list_plugins() -> list[dict[str, Any]]:
    """Every plugin found (path, entry point, --plugin), loaded or failed with its error."""
    return catalog.list_plugins()


def list_all() -> dict[str, Any]:
    """What ``mirserve passes --json`` prints and the service's pass listing serves."""
    return {"passes": list_passes(), "filters": list_filters(), "filter_bands": catalog.list_bands(),
            "pipelines": list_pipelines(), "plugins": list_plugins()}
