"""The registration functions a plugin calls; each attributes what it registers to the plugin being loaded.

The origin comes from the pass registry's ``origin()`` context, which the loader opens around each plugin, so
passes registered with ``worker.engine.passes.register_pass`` directly are attributed too. Everything else (filters,
callbacks, pipelines, targets, mirserve ops) must go through these functions to carry its origin.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from worker.engine import places
from worker.engine.kernels.cost import register_target_cost
from worker.engine.mirserve_domain import ops as domain
from worker.engine.passes.base import PassInfo, PassKind
from worker.engine.passes.pipelines import Pipeline, Step, get_pipeline, register_pipeline as _add_pipeline
from worker.engine.passes.registry import REGISTRY
from worker.engine.plugins.filters import (FILTERS, LAYER_FIRST, LAYER_LAST, PRIORITY_SIMPLIFY, Callback, CallbackFunction,
                                    Filter, FilterFunction, FilterRegistry, band_of)

if TYPE_CHECKING:
    from worker.engine.options import OptimizeOptions


def current_origin() -> str:
    """The plugin being loaded (its file, or its package and entry point); "built-in" outside a load."""
    return REGISTRY.current_origin


def _kernel_key(kernel: tuple[str, str] | str) -> tuple[str, str]:
    """(op_type, domain) from a pair or from "domain.op" / "op", as ``register_pass`` takes them."""
    if isinstance(kernel, tuple):
        return kernel
    domain_name, _, op = kernel.rpartition(".")
    return op, domain_name


def _info(name: str, description: str, kind: PassKind, level: int, targets: Iterable[str] | None,
          excluded_targets: Iterable[str], kernels: Iterable, portable: bool) -> PassInfo:
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"name {name!r} must be a non-empty string without spaces")
    if not isinstance(description, str) or not description or "\n" in description:
        raise ValueError(f"{name!r} needs a one-line description")
    if not isinstance(level, int) or not 0 <= level <= 2:
        raise ValueError(f"{name!r}: level must be 0, 1 or 2, not {level!r}")
    return PassInfo(name=name, kind=kind, description=description, level=level,
                    targets=frozenset(targets) if targets is not None else None,
                    excluded_targets=frozenset(excluded_targets), kernels=tuple(_kernel_key(k) for k in kernels),
                    portable=portable, origin=current_origin())


def register_filter(op_type: str, *, description: str, priority: int = PRIORITY_SIMPLIFY, domain: str = "",
                    name: str | None = None, level: int = 1, targets: Iterable[str] | None = None,
                    excluded_targets: Iterable[str] = (), kernels: Iterable = (), portable: bool = True,
                    registry: FilterRegistry | None = None):
    """Decorator binding ``fn(ctx, node)`` to nodes of ``op_type`` (or LAYER_FIRST / LAYER_LAST: every node).

    ``fn`` returns something truthy when it changed the graph (a dict is also kept as the trace detail, e.g.
    ``{"from": [...], "to": [...]}``). ``priority`` picks the level and the stage (see ``filters.BANDS``);
    level, targets, kernels and portable skip the filter exactly as they skip a pass. The name defaults to the
    function's name and shares the namespace of passes. ``registry`` is for tests.
    """
    if not isinstance(op_type, str) or not op_type:
        raise ValueError(f"a filter binds an op type, LAYER_FIRST or LAYER_LAST, not {op_type!r}")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"filter priority must be an integer, not {priority!r}")
    band_of(priority)  # raises for a priority outside every band
    if op_type in (LAYER_FIRST, LAYER_LAST) and domain:
        raise ValueError(f"{op_type} binds every node, so it takes no domain")

    def decorate(fn: FilterFunction) -> FilterFunction:
        info = _info(name or fn.__name__, description, PassKind.PROGRAM, level, targets, excluded_targets,
                     kernels, portable)
        (FILTERS if registry is None else registry).add(Filter(info, op_type, domain, priority, fn), REGISTRY)
        return fn

    return decorate


def _callback(when: str, name: str | None, description: str, level: int, targets, portable: bool,
              registry: FilterRegistry | None):
    def decorate(fn: CallbackFunction) -> CallbackFunction:
        info = _info(name or fn.__name__, description, PassKind.PROGRAM, level, targets, (), (), portable)
        (FILTERS if registry is None else registry).add(Callback(info, when, fn), REGISTRY)
        return fn

    return decorate


def register_pre_callback(*, description: str, name: str | None = None, level: int = 1,
                          targets: Iterable[str] | None = None, portable: bool = True,
                          registry: FilterRegistry | None = None):
    """Decorator for ``fn(ctx)`` run on the whole graph before the first filter stage; truthy if it changed it.

    Level 1 by default, so that ``--opt-level 0`` stays analysis only; a read-only callback may say level=0.
    """
    return _callback("pre", name, description, level, targets, portable, registry)


def register_post_callback(*, description: str, name: str | None = None, level: int = 1,
                           targets: Iterable[str] | None = None, portable: bool = True,
                           registry: FilterRegistry | None = None):
    """Decorator for ``fn(ctx)`` run on the whole graph after the last filter stage (before memory planning)."""
    return _callback("post", name, description, level, targets, portable, registry)


def register_pipeline(*, name: str, description: str, steps: Sequence[Step]) -> Pipeline:
    """A named pipeline with fixed steps (pass names and FixedPoint groups), selectable per run."""
    return _add_pipeline(Pipeline(name=name, description=description, steps=tuple(steps),
                                  origin=current_origin()))


def pipeline_builder(*, name: str, description: str):
    """Decorator for ``fn(options) -> steps``: a pipeline that chooses and orders its passes per run.

    Like the Sophon compiler's ``manage_passes(pm, options)``: the options of each job decide the steps.
    """
    def decorate(fn: Callable[["OptimizeOptions"], Sequence[Step]]):
        _add_pipeline(Pipeline(name=name, description=description, build=fn, origin=current_origin()))
        return fn

    return decorate


def default_steps(options: "OptimizeOptions") -> tuple[Step, ...]:
    """The default pipeline's steps for ``options``, for a pipeline that edits them."""
    return get_pipeline("default").steps_for(options)


def register_target(name: str, *, memory_space: str | None = None, description: str = "",
                    cost: Mapping | None = None) -> places.Target:
    """A new target for places (``name/fp32/nchw``); ``memory_space`` defaults to its own (a separate device).

    ``cost`` states what kernel pick weighs on it, as a ``[targets.NAME]`` table of the cost file
    (``worker/engine/kernels/data/costs.toml``): ``{"mac": {"fp16": 0.01, "default": 0.02}, "byte": 0.05}``
    and optionally its own ``io_copy`` / ``calib`` / ``layout`` figures; without it the target costs as the
    file's ``default``.
    """
    if cost is not None:
        register_target_cost(name, cost)
    return places.register_target(name, memory_space=memory_space, description=description,
                                  origin=current_origin())


def register_op(op: domain.DomainOp) -> domain.DomainOp:
    """An op of the ``mirserve`` domain (a fused op and its standard-op body), attributed to this plugin."""
    return domain.register_op(dataclasses.replace(op, origin=current_origin()))


def register_kernels(entries: Iterable, *, target: str | None = None) -> list:
    """Kernel table entries (the schema of ``worker/engine/kernels/data/*.json``), all of them or none.

    ``target`` applies to entries without their own; it may be a target this plugin registered. Each entry
    cites its fact in ``origin`` (defaulting to this plugin); the table files them under this plugin.
    """
    from worker.engine.kernels import default_table

    return default_table().add(entries, origin=current_origin(), target=target)
