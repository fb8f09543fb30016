"""The placement cost model: what running a node on a kernel costs, and what a cast between two kernels costs.

Kernel pick (worker.engine.passes.support.pick_plan) chooses every node's kernel to minimise the sum of both.
The figures are data (``data/costs.toml``): a weight per multiply-accumulate per target and precision, a
weight per byte per target, and per cast kind a fixed cost and a weight per byte written. A node costs

    mac[target][precision] * MACs + byte[target] * (bytes it reads and writes at the precision it runs in)

and a cast ``fixed + byte * bytes it writes`` (a target may state its own figures for the casts it runs:
a device with a DMA engine copies cheaper). A target the file does not list costs as ``default``; a plugin
that adds a target states its figures with ``register_target_cost`` (the plugin API's ``register_target``).
"""
from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from worker.engine.places import Precision

COSTS_FILE = Path(__file__).parent / "data" / "costs.toml"
CAST_KINDS = ("io_copy", "calib", "layout")


class CostModelError(ValueError):
    """The cost file is missing a figure or has one that is not a non-negative number."""


@dataclass(frozen=True)
class CastCost:
    fixed: float
    byte: float


@dataclass(frozen=True)
class TargetCost:
    mac: Mapping[str, float]    # precision name (or "default") -> units per MAC
    byte: float                 # units per byte read or written
    casts: Mapping[str, CastCost] = field(default_factory=dict)  # the target's own figures for its casts

    def per_mac(self, precision: Precision) -> float:
        return self.mac.get(precision.value, self.mac["default"])


@dataclass(frozen=True)
class CostModel:
    targets: Mapping[str, TargetCost]
    casts: Mapping[str, CastCost]

    def target(self, name: str) -> TargetCost:
        return self.targets.get(name) or self.targets["default"]

    def compute(self, target: str, precision: Precision, macs: int, nbytes: int) -> float:
        """Units to run a node of ``macs`` MACs touching ``nbytes`` bytes on ``target`` in ``precision``."""
        figures = self.target(target)
        return figures.per_mac(precision) * macs + figures.byte * nbytes

    def cast(self, kind: str, nbytes: int, target: str | None = None) -> float:
        """Units for one cast of ``kind`` writing ``nbytes`` bytes (run by ``target``'s kernel)."""
        figures = self.casts[kind]
        if target is not None:
            figures = self.target(target).casts.get(kind, figures)
        return figures.fixed + figures.byte * nbytes


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CostModelError(f"{where} must be a non-negative number, got {value!r}")
    return float(value)


def _cast_cost(entry, where: str) -> CastCost:
    if not isinstance(entry, Mapping):
        raise CostModelError(f"{where} must be a table with 'fixed' and 'byte'")
    return CastCost(_number(entry.get("fixed"), f"{where}.fixed"), _number(entry.get("byte"), f"{where}.byte"))


def parse_target_cost(name: str, entry) -> TargetCost:
    """One target's figures: ``{"mac": {"fp32": .., "default": ..}, "byte": .., "io_copy": {"fixed": .., ...}}``."""
    mac = entry.get("mac") if isinstance(entry, Mapping) else None
    if not isinstance(mac, Mapping) or "default" not in mac:
        raise CostModelError(f"targets.{name}.mac must be a table with a 'default' figure")
    return TargetCost({k: _number(v, f"targets.{name}.mac.{k}") for k, v in mac.items()},
                      _number(entry.get("byte"), f"targets.{name}.byte"),
                      {kind: _cast_cost(entry[kind], f"targets.{name}.{kind}") for kind in CAST_KINDS if kind in entry})


def parse_cost_model(data: Mapping) -> CostModel:
    """Validate the file's contents (a mapping as tomllib reads it) into a CostModel."""
    targets = {name: parse_target_cost(name, entry) for name, entry in (data.get("targets") or {}).items()}
    if "default" not in targets:
        raise CostModelError("the cost file has no [targets.default]")
    casts = {}
    for kind in CAST_KINDS:
        entry = (data.get("casts") or {}).get(kind)
        if entry is None:
            raise CostModelError(f"the cost file has no [casts.{kind}]")
        casts[kind] = _cast_cost(entry, f"casts.{kind}")
    return CostModel(targets, casts)


def load_cost_model(path: Path = COSTS_FILE) -> CostModel:
    with open(path, "rb") as handle:
        return parse_cost_model(tomllib.load(handle))


#: Figures of targets that plugins added, by target name.
_REGISTERED: dict[str, TargetCost] = {}


def register_target_cost(name: str, entry: Mapping) -> TargetCost:
    """State a (plugin's) target's figures, in the shape of a ``[targets.NAME]`` table of the cost file."""
    figures = parse_target_cost(name, entry)
    _REGISTERED[name] = figures
    _combined.cache_clear()
    return figures


def unregister_target_cost(name: str) -> None:
    if _REGISTERED.pop(name, None) is not None:
        _combined.cache_clear()


@functools.lru_cache(maxsize=1)
def _file_model() -> CostModel:
    return load_cost_model()


@functools.lru_cache(maxsize=1)
def _combined() -> CostModel:
    model = _file_model()
    return CostModel({**model.targets, **_REGISTERED}, model.casts) if _REGISTERED else model


def default_cost_model() -> CostModel:
    """The cost file's figures with those plugins registered."""
    return _combined()
