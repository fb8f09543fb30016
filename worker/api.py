"""The engine's one entry point: model path, places, options, progress callback -> optimized model, report.

The CLI and the service's job runner both call ``optimize``; neither reaches deeper into the engine.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from worker import __version__
from worker.errors import OptionsError
from worker.ir import load_model, save_model
from worker.numeric import DEFAULT_ATOL, DEFAULT_RTOL, FP16_ATOL, FP16_RTOL, verify
from worker.options import OptimizeOptions
from worker.passes import REGISTRY, PassContext, PassManager
from worker.passes.analysis.type_inference import apply_input_shapes
from worker.passes.pipelines import all_pipelines, get_pipeline, pass_names
from worker.kernels import default_table
from worker.places import Precision, ValidPlaces, all_targets, parse_places
from worker.plugins import catalog
from worker.plugins.loader import PLUGINS

__all__ = ["OptimizeOptions", "list_all", "list_filters", "list_passes", "list_pipelines", "list_plugins",
           "list_targets", "optimize", "validate_options"]

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


def tolerances(options: OptimizeOptions, places: ValidPlaces) -> tuple[float, float]:
    """The user's tolerances, or defaults: looser when any place or the weights are fp16."""
    half = options.fp16_storage or any(p.precision is Precision.FP16 for p in places)
    rtol, atol = (FP16_RTOL, FP16_ATOL) if half else (DEFAULT_RTOL, DEFAULT_ATOL)
    return (options.rtol if options.rtol is not None else rtol,
            options.atol if options.atol is not None else atol)


def optimize(model_path: str | os.PathLike, output_path: str | os.PathLike,
             options: OptimizeOptions = OptimizeOptions(), progress: Progress | None = None) -> dict[str, Any]:
    """Optimize the model at ``model_path`` into ``output_path`` and return the report.

    The output appears only once it is complete and (unless ``options.verify`` is off) verified.
    Raises a MirserveError subclass for anything the user can fix.
    """
    started = time.perf_counter()
    places = validate_options(options)
    model_path, output_path = Path(model_path), Path(output_path)
    directory = output_path.parent if str(output_path.parent) else Path(".")
    if not directory.is_dir():
        raise OptionsError(f"{output_path}: the output directory {directory} does not exist", field="output")
    model = load_model(model_path, trusted_external_data=options.trusted_external_data)
    apply_input_shapes(model.graph, options.input_shapes)
    before = {"path": str(model_path), "nodes": len(model.graph), "bytes": model_path.stat().st_size}
    ctx = PassContext(model=model, options=options, places=places, kernels=default_table())
    manager = PassManager(progress=progress)
    if options.check_support_only:
        return _support_report(ctx, manager, before, places, started)
    trace = manager.run(ctx, get_pipeline(options.pipeline).steps_for(options))
    rtol, atol = tolerances(options, places)
    verification: dict[str, Any] | None = None

    def check(candidate: Path) -> None:
        nonlocal verification
        if options.verify:
            verification = verify(str(model_path), str(candidate), input_shapes=options.input_shapes,
                                  runs=options.verify_runs, rtol=rtol, atol=atol)

    saved = save_model(model, output_path, check=check)
    report: dict[str, Any] = {
        "version": __version__,
        "model": {"input": before, "output": {"path": str(output_path), "nodes": len(model.graph),
                                              "bytes": saved.bytes,
                                              "external_data": str(saved.external_data) if saved.external_data
                                              else None}},
        "places": [str(p) for p in places],
        "pipeline": options.pipeline,
        "options": options.to_dict(),
        "trace": trace,
        "verification": verification,
        "memory": None,  # filled by the memory_plan pass when the pipeline runs it
        "plugins": catalog.list_plugins(),
    }
    report.update(ctx.report)
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report


def _support_report(ctx: PassContext, manager: PassManager, before: dict, places: ValidPlaces,
                    started: float) -> dict[str, Any]:
    """--check-support: type inference and the support check only; nothing is written."""
    trace = manager.run(ctx, ("type_inference", "support_check"))
    return {"version": __version__, "model": {"input": before, "output": None},
            "places": [str(p) for p in places], "pipeline": None, "options": ctx.options.to_dict(),
            "trace": trace, "verification": None, "support": ctx.report.get("support"),
            "seconds": round(time.perf_counter() - started, 3)}


def list_targets() -> list[dict[str, Any]]:
    """Every registered target with its memory, the source of its kernel table, and its kernels."""
    PLUGINS.ensure_loaded()
    table = default_table()
    found = []
    for target in all_targets():
        kernels = sorted(table.by_target(target.name), key=lambda k: (k.domain, k.op, k.since))
        found.append({"name": target.name, "memory_space": target.memory_space,
                      "description": target.description, "origin": target.origin,
                      "source": table.source(target.name),
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
