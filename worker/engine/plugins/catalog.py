"""What is registered, for the listings, and whether the names a run asks for exist (or why not).

``worker.engine.api`` calls these; the CLI and the service only ever go through ``worker.engine.api``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker.engine.errors import MirserveError, OptionsError
from worker.engine.passes.pipelines import Pipeline, Step, all_pipelines, get_pipeline, pass_names
from worker.engine.passes.registry import REGISTRY
from worker.engine.plugins.filters import BANDS, FILTERS
from worker.engine.plugins.loader import PLUGINS, describe

if TYPE_CHECKING:
    from worker.engine.options import OptimizeOptions


def list_filters() -> list[dict[str, Any]]:
    """Filters in run order (stage, priority, registration), then pre- and post-callbacks."""
    PLUGINS.ensure_loaded()
    filters = sorted(FILTERS.filters(), key=lambda f: f.priority)
    return [f.to_dict() for f in filters] + [c.to_dict() for c in FILTERS.callbacks("pre")] + \
        [c.to_dict() for c in FILTERS.callbacks("post")]


def list_plugins() -> list[dict[str, Any]]:
    """Every plugin found, in load order, loaded or failed with its error."""
    PLUGINS.ensure_loaded()
    return [r.to_dict() for r in PLUGINS.records]


def list_bands() -> list[dict[str, Any]]:
    return [b.to_dict() for b in BANDS]


def check_options(options: "OptimizeOptions") -> tuple[Step, ...]:
    """The steps of the run's pipeline, after checking every name the run uses; OptionsError otherwise.

    A name missing because a plugin failed to load is reported with that plugin's error.
    """
    PLUGINS.ensure_loaded()
    pipeline = get_pipeline(options.pipeline)
    if pipeline is None:
        raise OptionsError(_unknown("pipeline", "pipelines", options.pipeline,
                                    ", ".join(p.name for p in all_pipelines())), field="pipeline")
    steps = build_steps(pipeline, options)
    for name in pass_names(steps):
        if not isinstance(name, str) or name not in REGISTRY:
            why = PLUGINS.why_missing("passes", name) if isinstance(name, str) else None
            raise OptionsError(f"pipeline {pipeline.name!r} from {pipeline.origin} names pass {name!r}, which is "
                               f"not registered" + (f"; {why}" if why else ""), field="pipeline")
    for name in options.disabled_passes:
        if name not in REGISTRY and name not in FILTERS:
            why = PLUGINS.why_missing("passes", name) or PLUGINS.why_missing("filters", name)
            raise OptionsError(f"unknown pass {name!r} in disabled_passes" + (f"; {why}" if why else "") +
                               "; `mirserve passes` lists them", field="disabled_passes")
    return steps


def build_steps(pipeline: Pipeline, options: "OptimizeOptions") -> tuple[Step, ...]:
    """A pipeline's steps for ``options``; a plugin builder that raises is reported with its origin."""
    try:
        return pipeline.steps_for(options)
    except MirserveError:
        raise
    except Exception as exc:
        raise OptionsError(f"pipeline {pipeline.name!r} from {pipeline.origin} failed to choose its passes: "
                           f"{describe(exc)}", field="pipeline") from exc


def _unknown(kind: str, plural: str, name: str, known: str) -> str:
    why = PLUGINS.why_missing(plural, name)
    return f"unknown {kind} {name!r}" + (f"; {why}" if why else "") + f"; known {plural}: {known}"
