"""What a user can ask of one optimization run, validated in one place for the CLI and the service."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

from onnx.defs import onnx_opset_version

from worker.engine.errors import OptionsError
from worker.engine.limits import Limits
from worker.engine.places import DEFAULT_PLACES

MAX_OPT_LEVEL = 2
#: Longest place list accepted (a few dozen places): longer is no list anyone means.
MAX_PLACES_CHARS = 2000
#: Fields that requests cannot set: whoever runs the engine does.
NOT_FROM_DATA = frozenset({"limits"})
#: The opsets a model may be raised to: onnx's version converter starts at 7 (the first opset with
#: broadcasting as it is now) and ends at the newest opset the installed onnx defines.
MIN_TARGET_OPSET, MAX_TARGET_OPSET = 7, onnx_opset_version()


def strict_default() -> bool:
    """``strict`` unless asked: off, or on where ``MIRSERVE_STRICT=1`` (the test suite sets it)."""
    return os.environ.get("MIRSERVE_STRICT", "") == "1"


@dataclass(frozen=True)
class OptimizeOptions:
    places: str = DEFAULT_PLACES
    input_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    opt_level: int = 2
    disabled_passes: Sequence[str] = ()
    pipeline: str = "default"
    portable: bool = False
    fp16_storage: bool = False
    host_fallback: bool = True
    check_support_only: bool = False
    verify: bool = True
    #: Publish a model that cannot be verified (onnxruntime cannot load or run the input) with ``verified``
    #: false and a warning, instead of failing the run.
    allow_unverified: bool = False
    #: Auto mixed precision: when a model placed on fp16 (or int8) places fails verification, find the fewest nodes
    #: that must compute in fp32, move them to an fp32 place and verify again; with fp16_storage, the fewest
    #: weights to keep in fp32 likewise (off: fail the run).
    precision_fallback: bool = True
    verify_runs: int = 1
    rtol: float | None = None
    atol: float | None = None
    dim_bounds: Mapping[str, int] = field(default_factory=dict)
    #: Keep only what lies between these values (ncnnoptimize's cutstart/cutend); they become the graph's
    #: inputs and outputs. Either may be empty: the model's own inputs or outputs then bound the cut.
    cut_start: Sequence[str] = ()
    cut_end: Sequence[str] = ()
    #: Raise the model's opset to this one first (onnx's version converter), so fusions into ops of newer
    #: opsets apply (Gelu 20; RMSNormalization, RotaryEmbedding, Attention 23). None keeps the model's opset.
    target_opset: int | None = None
    #: A pass that fails (a bug, not a user error) fails the run, instead of being undone with a warning.
    strict: bool = field(default_factory=strict_default)
    #: What the model may make the run spend (``worker.engine.limits``): set by whoever runs the engine (the
    #: command line's ``--limit``, the service from its settings), never by a job's options.
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OptimizeOptions":
        """Build options from JSON-like data, naming the offending field on any error."""
        if not isinstance(data, Mapping):
            raise OptionsError("options must be a JSON object", field="options")
        known = {f.name for f in fields(cls)} - NOT_FROM_DATA
        unknown = sorted(set(data) - known)
        if unknown:
            raise OptionsError(f"unknown option {unknown[0]!r}; known options: {', '.join(sorted(known))}",
                               field=unknown[0])
        values = dict(data)
        if "input_shapes" in values:
            values["input_shapes"] = _shapes(values["input_shapes"])
        if "dim_bounds" in values:
            values["dim_bounds"] = _bounds(values["dim_bounds"])
        for name, what in (("disabled_passes", "pass names"), ("cut_start", "value names"),
                           ("cut_end", "value names")):
            if name in values:
                values[name] = _names(values[name], name, what)
        options = cls(**values)
        options.check_types()
        return options

    def check_types(self) -> None:
        """Range and type checks that need neither the model nor the registries."""
        _expect(isinstance(self.places, str), "places", "must be a comma-separated string of places")
        _expect(isinstance(self.opt_level, int) and not isinstance(self.opt_level, bool)
                and 0 <= self.opt_level <= MAX_OPT_LEVEL, "opt_level",
                f"must be an integer from 0 to {MAX_OPT_LEVEL}")
        _expect(isinstance(self.pipeline, str) and bool(self.pipeline), "pipeline", "must be a pipeline name")
        _expect(len(self.places) <= MAX_PLACES_CHARS, "places", f"must be at most {MAX_PLACES_CHARS} characters")
        for name in ("portable", "fp16_storage", "host_fallback", "check_support_only", "verify", "allow_unverified",
                     "strict", "precision_fallback"):
            _expect(isinstance(getattr(self, name), bool), name, "must be true or false")
        _expect(isinstance(self.verify_runs, int) and not isinstance(self.verify_runs, bool)
                and 1 <= self.verify_runs <= 16, "verify_runs", "must be an integer from 1 to 16")
        _expect(isinstance(self.limits, Limits), "limits", "must be a Limits value")
        _expect(self.target_opset is None or (isinstance(self.target_opset, int)
                                              and not isinstance(self.target_opset, bool)
                                              and MIN_TARGET_OPSET <= self.target_opset <= MAX_TARGET_OPSET),
                "target_opset", f"must be an integer from {MIN_TARGET_OPSET} to {MAX_TARGET_OPSET}")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            _expect(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and math.isfinite(value) and 0 <= value <= 1),
                    name, "must be a number from 0 to 1")

    def to_dict(self) -> dict[str, Any]:
        """The options as ``from_dict`` reads them (the limits are not among them)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_FROM_DATA}
        data["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        data["dim_bounds"] = dict(self.dim_bounds)
        for name in ("disabled_passes", "cut_start", "cut_end"):
            data[name] = list(getattr(self, name))
        return data


def _expect(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise OptionsError(f"option {name} {message}", field=name)


def _shapes(data: Any) -> dict[str, tuple[int, ...]]:
    if not isinstance(data, Mapping):
        raise OptionsError("option input_shapes must map input names to lists of dimensions",
                           field="input_shapes")
    shapes = {}
    for name, dims in data.items():
        if not isinstance(dims, (list, tuple)) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 2**31 for d in dims):
            raise OptionsError(f"input shape of {name!r} must be a list of non-negative integers, got {dims!r}",
                               field="input_shapes")
        shapes[str(name)] = tuple(dims)
    return shapes


def _bounds(data: Any) -> dict[str, int]:
    if not isinstance(data, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in data.values()):
        raise OptionsError("option dim_bounds must map dimension names to positive integers",
                           field="dim_bounds")
    return {str(k): v for k, v in data.items()}


def _names(data: Any, field: str, what: str) -> tuple[str, ...]:
    """A list of names, or one comma-separated string of them."""
    if isinstance(data, str):
        data = [n for n in data.split(",") if n.strip()]
    if not isinstance(data, (list, tuple)) or not all(isinstance(n, str) and n.strip() for n in data):
        raise OptionsError(f"option {field} must be a list of {what}", field=field)
    return tuple(n.strip() for n in data)


def parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse an input shape as users type it: ``NAME=D0,D1,...``, onnxsim's ``NAME:D0,D1,...`` or trtexec's
    ``NAME:D0xD1x...`` (a name may itself contain ':' or '=': the last '=' separates, else the last ':')."""
    separator = "=" if "=" in text else ":"
    name, sep, dims = text.rpartition(separator)
    if not sep or not name:
        raise OptionsError(f"bad input shape {text!r}: expected NAME=D0,D1,... (or NAME:D0,D1,... or "
                           f"NAME:D0xD1x...)", field="input_shapes")
    tokens = [t.strip() for t in re.split(r"[,x]", dims)] if dims.strip() else []
    try:
        values = tuple(int(t) for t in tokens)
    except ValueError:
        raise OptionsError(f"bad input shape {text!r}: dimensions must be integers", field="input_shapes") from None
    if any(d < 0 for d in values):
        raise OptionsError(f"bad input shape {text!r}: dimensions must not be negative", field="input_shapes")
    return name, values
