"""The place type system: where a kernel runs and in what form it takes its data.

A place is (target, precision, layout), written ``arm/fp16/nhwc``. The user gives valid places in priority
order; like Paddle-Lite, a host place is appended as the lowest-priority fallback so that every standard op
has somewhere to run. Targets are open (a plugin may register one); precisions and layouts are closed sets
because casts between them have fixed meanings in ONNX.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Sequence

from onnx import TensorProto

from worker.engine.errors import PlaceError
from worker.engine.origin import current_origin


@dataclass(frozen=True)
class Target:
    """A device kind. Targets with the same ``memory_space`` read each other's buffers without a copy."""

    name: str
    memory_space: str
    description: str = ""
    origin: str = "built-in"

    def __str__(self) -> str:
        return self.name

    def shares_memory_with(self, other: "Target") -> bool:
        return self.memory_space == other.memory_space


_TARGETS: dict[str, Target] = {}


def register_target(name: str, *, memory_space: str | None = None, description: str = "",
                    origin: str | None = None) -> Target:
    """Add a target; ``memory_space`` defaults to its own name (a device with its own memory), ``origin`` to
    whoever is registering (``worker.engine.origin``)."""
    origin = origin or current_origin()
    if not name or not name.isidentifier() or name != name.lower():
        raise ValueError(f"target name {name!r} must be a lower-case identifier")
    existing = _TARGETS.get(name)
    if existing is not None:
        raise ValueError(f"target {name!r} is already registered by {existing.origin}")
    target = Target(name, memory_space or name, description, origin)
    _TARGETS[name] = target
    return target


def unregister_target(name: str, *, force: bool = False) -> None:
    """Remove a target a plugin registered; built-in targets stay unless ``force`` (undoing a plugin whose
    registration only claimed to be built-in)."""
    target = _TARGETS.get(name)
    if target is not None and (force or target.origin != "built-in"):
        del _TARGETS[name]


def get_target(name: str) -> Target:
    try:
        return _TARGETS[name]
    except KeyError:
        raise PlaceError(f"unknown target {name!r}; allowed: {', '.join(_TARGETS)}") from None


def all_targets() -> list[Target]:
    return list(_TARGETS.values())


# Host, x86 and ARM share memory, as in Paddle-Lite: moving a value between them needs no copy.
HOST = register_target("host", memory_space="host", description="reference kernels for every standard op")
X86 = register_target("x86", memory_space="host", description="x86-64 CPU (onnxruntime's CPU kernels)")
ARM = register_target("arm", memory_space="host", description="ARM CPU")
CUDA = register_target("cuda", description="NVIDIA GPU")
OPENCL = register_target("opencl", description="OpenCL GPU")
NPU = register_target("npu", description="neural processing unit")


class Precision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"
    ANY = "any"

    def __str__(self) -> str:
        return self.value


#: Precisions auto mixed precision takes a node out of, to an fp32 place (``worker.engine.amp``).
REDUCED_PRECISIONS = frozenset({Precision.FP16, Precision.INT8})


class Layout(str, enum.Enum):
    NCHW = "nchw"
    NHWC = "nhwc"
    ANY = "any"

    def __str__(self) -> str:
        return self.value


_PRECISION_OF_DTYPE = {
    TensorProto.FLOAT: Precision.FP32,
    TensorProto.FLOAT16: Precision.FP16,
    TensorProto.INT8: Precision.INT8,
    TensorProto.UINT8: Precision.INT8,
    TensorProto.INT32: Precision.INT32,
    TensorProto.INT64: Precision.INT64,
    TensorProto.BOOL: Precision.BOOL,
}

_DTYPE_OF_PRECISION = {
    Precision.FP32: TensorProto.FLOAT,
    Precision.FP16: TensorProto.FLOAT16,
    Precision.INT32: TensorProto.INT32,
    Precision.INT64: TensorProto.INT64,
    Precision.BOOL: TensorProto.BOOL,
}


def precision_of_dtype(dtype: int) -> Precision:
    """The precision an ONNX element type is stored in; types without a precision of their own are ANY."""
    return _PRECISION_OF_DTYPE.get(dtype, Precision.ANY)


def dtype_of_precision(precision: Precision) -> int | None:
    """The ONNX element type of a float or integer precision; None for INT8 (signedness varies) and ANY."""
    return _DTYPE_OF_PRECISION.get(precision)


def _parse_enum(kind: type[enum.Enum], text: str, part: str, whole: str):
    try:
        return kind(text)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise PlaceError(f"bad {part} {text!r} in place {whole!r}; allowed: {allowed}") from None


@dataclass(frozen=True)
class Place:
    target: Target
    precision: Precision
    layout: Layout

    def __str__(self) -> str:
        return f"{self.target.name}/{self.precision.value}/{self.layout.value}"

    @classmethod
    def parse(cls, text: str) -> "Place":
        """Parse ``target/precision/layout``; precision and layout may be omitted (fp32, nchw)."""
        whole = text.strip()
        parts = [p.strip().lower() for p in whole.split("/")]
        if not whole or len(parts) > 3 or any(not p for p in parts):
            raise PlaceError(f"bad place {text!r}: expected target/precision/layout, e.g. arm/fp16/nhwc")
        if parts[0] not in _TARGETS:
            raise PlaceError(f"bad target {parts[0]!r} in place {whole!r}; allowed: {', '.join(_TARGETS)}")
        precision = _parse_enum(Precision, parts[1], "precision", whole) if len(parts) > 1 else Precision.FP32
        layout = _parse_enum(Layout, parts[2], "layout", whole) if len(parts) > 2 else Layout.NCHW
        return cls(_TARGETS[parts[0]], precision, layout)


DEFAULT_PLACES = "x86/fp32/nchw"


@dataclass(frozen=True)
class ValidPlaces:
    """The places a model may use, best first; ``user_count`` of them were given, the rest are fallbacks."""

    places: tuple[Place, ...]
    user_count: int

    def __iter__(self):
        return iter(self.places)

    def __len__(self) -> int:
        return len(self.places)

    def __str__(self) -> str:
        return ",".join(map(str, self.places))

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(p.target.name for p in self.places)

    def weight(self, place: Place) -> float:
        """Paddle-Lite's priority weight: place i of N weighs (N - i) / N."""
        n = len(self.places)
        return (n - self.places.index(place)) / n

    def index(self, place: Place) -> int:
        return self.places.index(place)


def parse_places(spec: str | Sequence[str | Place] | None = None, *, host_fallback: bool = True) -> ValidPlaces:
    """Parse a comma-separated place list (or a sequence) into valid places, duplicates dropped.

    With ``host_fallback`` a host place is appended for every distinct (precision, layout) of the non-OpenCL
    places, as Paddle-Lite does, plus host/fp32/nchw when the list would otherwise have no host place.
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        spec = DEFAULT_PLACES
    items: Iterable[str | Place] = spec.split(",") if isinstance(spec, str) else spec
    places: list[Place] = []
    for item in items:
        place = item if isinstance(item, Place) else Place.parse(item)
        if place not in places:
            places.append(place)
    user_count = len(places)
    if host_fallback:
        fallbacks = [Place(HOST, p.precision, p.layout) for p in places if p.target is not OPENCL]
        if not any(p.target is HOST for p in places + fallbacks):
            fallbacks.append(Place(HOST, Precision.FP32, Layout.NCHW))
        for place in fallbacks:
            if place not in places:
                places.append(place)
    return ValidPlaces(tuple(places), user_count)
