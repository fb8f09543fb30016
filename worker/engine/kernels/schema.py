"""What a kernel table entry says, and the checks an entry must pass before the table accepts it.

An entry is one kernel a target registers, in Paddle-Lite's sense (a KernelLite bound to a place, with the
declared type of every input and output): the op it implements (type, domain, opset range), the place it
computes in, the declared (target, precision, layout) of each port, the attribute constraints outside which
it does not apply, and where the fact comes from. Entries are data; this module only validates them.

PortSpec precision and layout are either concrete, ``any`` (the port accepts whatever arrives and nothing is
converted for it), or ``same`` (the port follows the kernel's own precision or layout; when the kernel's is
``any`` too, kernel pick resolves it from the node's actual inputs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from onnx import TensorProto

from worker.engine.places import Layout, Precision

SAME = "same"
ANY = "any"
#: A port whose values may each have their own type (Loop's and Scan's carried values, If's outputs): each is
#: taken in the precision the node's facts give it (a Loop's, the body input's it becomes), never the kernel's.
EACH = "each"
OPEN = None  # an opset range without an upper end

PRECISIONS = frozenset(p.value for p in Precision)
LAYOUTS = frozenset(layout.value for layout in Layout)

#: ONNX element type names a precision ``any`` kernel may list as the types it accepts.
ELEMENT_TYPES = frozenset(name.lower() for name in TensorProto.DataType.keys() if name != "UNDEFINED")

#: Constraint name -> what its value must look like (checked in ``_check_constraints``).
CONSTRAINTS = {
    "rank": "list of allowed ranks of the first input",
    "group": "list of allowed group kinds: 'one' (ordinary), 'depthwise' (group == channels), 'grouped'",
    "kernel_shape": "list of allowed square kernel sizes",
    "constant_inputs": "list of input slots that must be constants (weights known offline)",
    "attributes": "mapping of attribute name to the list of values the kernel accepts",
    "max_outputs": "how many outputs the kernel produces at most (e.g. MaxPool without Indices)",
}


class KernelTableError(ValueError):
    """A kernel entry is malformed, or clashes with one already registered."""


@dataclass(frozen=True)
class PortSpec:
    """The declared type of one formal input or output, as the table states it (``same`` and ``any`` open);
    kernel pick resolves it against a node into a ``Port``."""

    name: str
    precision: str = SAME
    layout: str = SAME
    #: None: the kernel's own target (device memory); otherwise the target whose memory the port reads.
    target: str | None = None
    optional: bool = False
    variadic: bool = False
    #: For precision ``any``: the element types the op accepts there (None: all). A float arriving in a
    #: type not listed is converted to the listed one (an fp16 value into a port that takes only float).
    types: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "precision": self.precision, "layout": self.layout}
        if self.types is not None:
            out["types"] = list(self.types)
        if self.target is not None:
            out["target"] = self.target
        if self.optional:
            out["optional"] = True
        if self.variadic:
            out["variadic"] = True
        return out


@dataclass(frozen=True)
class Kernel:
    op: str
    domain: str
    since: int
    until: int | None
    target: str
    precision: Precision
    layout: Layout
    inputs: tuple[PortSpec, ...]
    outputs: tuple[PortSpec, ...]
    origin: str
    #: Distinguishes kernels that share op and place (Paddle-Lite's alias: ``int8_out`` / ``fp32_out``).
    variant: str = ""
    #: For precision ``any``: the element types the kernel accepts on its ``same`` ports (None: all).
    types: tuple[str, ...] | None = None
    constraints: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: Who added the entry to the table: a data file name or a plugin (``origin`` cites the fact itself).
    registered_by: str = field(default="", compare=False)

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op

    @property
    def place_text(self) -> str:
        return f"{self.target}/{self.precision.value}/{self.layout.value}"

    @property
    def id(self) -> str:
        """Unique within a table: names target, op, opset range, precision, layout and variant."""
        until = "" if self.until is None else str(self.until)
        text = f"{self.target}:{self.qualified_op}:{self.since}-{until}:{self.precision.value}:{self.layout.value}"
        return f"{text}:{self.variant}" if self.variant else text

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)

    def overlaps(self, other: "Kernel") -> bool:
        low = max(self.since, other.since)
        ends = [end for end in (self.until, other.until) if end is not None]
        return not ends or low <= min(ends)

    def same_slot(self, other: "Kernel") -> bool:
        """Both claim the same kernel: same target, op, place and variant over overlapping opsets."""
        return ((self.target, self.domain, self.op, self.precision, self.layout, self.variant)
                == (other.target, other.domain, other.op, other.precision, other.layout, other.variant)
                and self.overlaps(other))

    def input_port(self, slot: int) -> PortSpec | None:
        """The port that input ``slot`` binds to (the last port absorbs a variadic tail)."""
        if slot < len(self.inputs):
            return self.inputs[slot]
        if self.inputs and self.inputs[-1].variadic:
            return self.inputs[-1]
        return None

    def output_port(self, slot: int) -> PortSpec | None:
        if slot < len(self.outputs):
            return self.outputs[slot]
        if self.outputs and self.outputs[-1].variadic:
            return self.outputs[-1]
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "domain": self.domain, "since": self.since, "until": self.until,
                               "precision": self.precision.value, "layout": self.layout.value}
        if self.variant:
            out["variant"] = self.variant
        if self.types is not None:
            out["types"] = list(self.types)
        out["inputs"] = [p.to_dict() for p in self.inputs]
        out["outputs"] = [p.to_dict() for p in self.outputs]
        if self.constraints:
            out["constraints"] = _plain(self.constraints)
        out["origin"] = self.origin
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


_ENTRY_KEYS = {"op", "domain", "since", "until", "precision", "layout", "variant", "types", "inputs", "outputs",
               "constraints", "origin", "target"}
_PORT_KEYS = {"name", "precision", "layout", "target", "optional", "variadic", "types"}


def kernel_from_dict(data: Mapping[str, Any], *, target: str, where: str, default_origin: str = "",
                     registered_by: str = "") -> Kernel:
    """Build and validate one entry; ``where`` names the file and entry index for error messages."""
    if not isinstance(data, (dict, Mapping)):
        raise KernelTableError(f"{where}: a kernel entry must be an object, not {type(data).__name__}")
    unknown = set(data) - _ENTRY_KEYS
    if unknown:
        raise KernelTableError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    if data.get("target", target) != target:
        raise KernelTableError(f"{where}: entry names target {data['target']!r} inside the {target!r} table")
    op = _text(data, "op", where)
    domain = data.get("domain", "")
    if not isinstance(domain, str):
        raise KernelTableError(f"{where}: 'domain' must be a string")
    since, until = _opset_range(data, where)
    precision = _enum(Precision, data.get("precision"), "precision", where)
    layout = _enum(Layout, data.get("layout"), "layout", where)
    inputs = tuple(_port(p, f"{where} input {i}") for i, p in enumerate(_list(data, "inputs", where)))
    outputs = tuple(_port(p, f"{where} output {i}") for i, p in enumerate(_list(data, "outputs", where)))
    if not outputs:
        raise KernelTableError(f"{where}: a kernel declares at least one output")
    types = _types(data, precision, where)
    constraints = _check_constraints(data.get("constraints", {}), where)
    origin = data.get("origin", default_origin)
    if not isinstance(origin, str) or not origin:
        raise KernelTableError(f"{where}: every entry needs an 'origin' saying where the fact comes from")
    variant = data.get("variant", "")
    if not isinstance(variant, str):
        raise KernelTableError(f"{where}: 'variant' must be a string")
    return Kernel(op=op, domain=domain, since=since, until=until, target=target, precision=precision,
                  layout=layout, inputs=inputs, outputs=outputs, origin=origin, variant=variant, types=types,
                  constraints=_frozen(constraints), registered_by=registered_by)


def _text(data: Mapping, key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise KernelTableError(f"{where}: {key!r} must be a non-empty string")
    return value


def _list(data: Mapping, key: str, where: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise KernelTableError(f"{where}: {key!r} must be a list")
    return value


def _opset_range(data: Mapping, where: str) -> tuple[int, int | None]:
    since, until = data.get("since"), data.get("until")
    if not isinstance(since, int) or isinstance(since, bool) or since < 1:
        raise KernelTableError(f"{where}: 'since' must be an opset version >= 1, got {since!r}")
    if until is not None and (not isinstance(until, int) or isinstance(until, bool) or until < since):
        raise KernelTableError(f"{where}: 'until' must be null or an opset version >= since ({since}), "
                               f"got {until!r}")
    return since, until


def _enum(kind, value, name: str, where: str):
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise KernelTableError(f"{where}: bad {name} {value!r}; allowed: {allowed}") from None


def _port(data: Any, where: str) -> PortSpec:
    if isinstance(data, dict):
        key = tuple(data.items())
        try:
            cached = _PORT_CACHE.get(key)
        except TypeError:  # unhashable values (the types list): validate without the cache
            return _parse_port(data, where)
        if cached is not None:
            return cached
        port = _parse_port(data, where)
        _PORT_CACHE[key] = port
        return port
    return _parse_port(data, where)


#: Tables repeat the same few ports thousands of times; each distinct one is validated once.
_PORT_CACHE: dict[tuple, PortSpec] = {}


def _parse_port(data: Any, where: str) -> PortSpec:
    if not isinstance(data, Mapping):
        raise KernelTableError(f"{where}: a port must be an object")
    unknown = set(data) - _PORT_KEYS
    if unknown:
        raise KernelTableError(f"{where}: unknown port field(s) {', '.join(sorted(unknown))}")
    name = _text(data, "name", where)
    precision, layout = data.get("precision", SAME), data.get("layout", SAME)
    if precision not in (SAME, EACH) and precision not in PRECISIONS:
        raise KernelTableError(f"{where}: bad port precision {precision!r}")
    if layout != SAME and layout not in LAYOUTS:
        raise KernelTableError(f"{where}: bad port layout {layout!r}")
    target = data.get("target")
    if target is not None and (not isinstance(target, str) or not target):
        raise KernelTableError(f"{where}: port 'target' must be a target name")
    flags = {k: data.get(k, False) for k in ("optional", "variadic")}
    for key, flag in flags.items():
        if not isinstance(flag, bool):
            raise KernelTableError(f"{where}: port {key!r} must be true or false")
    types = data.get("types")
    if types is not None:
        if precision not in (ANY, EACH) or not isinstance(types, list) or not types \
                or not set(types) <= ELEMENT_TYPES:
            raise KernelTableError(f"{where}: port 'types' must be a non-empty list of ONNX element type "
                                   f"names, on a port of precision 'any' or 'each'")
        types = tuple(types)
    return PortSpec(name, precision, layout, target, flags["optional"], flags["variadic"], types)


def _types(data: Mapping, precision: Precision, where: str) -> tuple[str, ...] | None:
    types = data.get("types")
    if types is None:
        return None
    if precision is not Precision.ANY:
        raise KernelTableError(f"{where}: 'types' only applies to precision 'any' kernels")
    if not isinstance(types, list) or not types or not all(t in ELEMENT_TYPES for t in types):
        raise KernelTableError(f"{where}: 'types' must be a non-empty list of ONNX element type names")
    return tuple(types)


def _check_constraints(constraints: Any, where: str) -> dict:
    if not isinstance(constraints, Mapping):
        raise KernelTableError(f"{where}: 'constraints' must be an object")
    for name, value in constraints.items():
        if name not in CONSTRAINTS:
            raise KernelTableError(f"{where}: unknown constraint {name!r}; known: {', '.join(CONSTRAINTS)}")
        if name == "attributes":
            if not isinstance(value, Mapping) or not all(isinstance(v, list) and v for v in value.values()):
                raise KernelTableError(f"{where}: constraint 'attributes' must map names to non-empty lists")
        elif name == "max_outputs":
            if not isinstance(value, int) or value < 1:
                raise KernelTableError(f"{where}: constraint 'max_outputs' must be a positive integer")
        elif name == "group":
            if not isinstance(value, list) or not set(value) <= {"one", "depthwise", "grouped"} or not value:
                raise KernelTableError(f"{where}: constraint 'group' must list 'one', 'depthwise', 'grouped'")
        elif not isinstance(value, list) or not value or not all(isinstance(v, int) for v in value):
            raise KernelTableError(f"{where}: constraint {name!r} must be a non-empty list of integers")
    return dict(constraints)
