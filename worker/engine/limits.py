"""What an untrusted model may make the engine spend, checked before the work that would spend it.

A model of a few hundred bytes can ask for a tensor of any size (``ConstantOfShape [16384, 16384]``,
``Range(0, 1e10, 1)``), a loop of 2^62 iterations, a million nested bodies, or a folded weight of gigabytes.
Every such bound lives here, in one ``Limits`` value that travels with the options (``OptimizeOptions.limits``):
the loader checks the counts and the nesting, type inference the tensors that ops sized by input values would
create and the trip counts of loops, constant folding its byte budget, the run the size of its output, and
numeric verification runs each check in a child under its own time and memory budget. Each refusal is a
``LimitError`` naming the node (or the model) and the limit, with the command-line flag that raises it.

The command line applies the defaults (``--limit NAME=VALUE`` raises one); the service applies the defaults
and derives verification's budgets from the job's own time and memory limits. Clients cannot change them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Sequence

import numpy as np

from worker.engine.errors import ModelError, OptionsError

MiB = 1 << 20

#: Ops whose output size follows from input values (not only input shapes): bounded before computing them.
SIZED_BY_VALUE = frozenset({"ConstantOfShape", "Expand", "Tile", "Range"})
#: Ops that can make a tensor much larger than their inputs; their inferred outputs are bounded too.
GENERATORS = SIZED_BY_VALUE | {"Resize", "Upsample", "Pad", "Loop", "Scan", "SequenceConstruct",
                               "ConcatFromSequence", "Col2Im", "MaxUnpool"}


class LimitError(ModelError):
    """The model asks for more than a limit allows; the message names the node or model and the limit."""


@dataclass(frozen=True)
class Limits:
    """Bounds on one run; byte sizes in bytes, times in seconds (``--limit`` takes MiB for the ``_mb`` ones)."""

    #: Nodes of the model, all bodies included.
    max_nodes: int = 2_000_000
    #: Values (inputs, initializers, node outputs) of the model, all bodies included.
    max_values: int = 4_000_000
    #: Levels of bodies inside bodies (If, Loop, Scan).
    max_depth: int = 32
    #: Largest dimension a value or an initializer may declare.
    max_dim: int = 2**31
    #: Elements of one tensor that an op sized by values (ConstantOfShape, Range, Expand, Tile) or a generator
    #: (Resize, Pad, a Loop's scan outputs, ...) would create.
    max_tensor_elements: int = 1 << 28
    #: Bytes of one such tensor.
    max_tensor_mb: int = 512
    #: Bytes that constant folding may add to the model in one run, over all folded results.
    max_folded_mb: int = 1024
    #: The optimized model may hold max(this, ``output_factor`` x the input file) bytes of weights.
    max_output_mb: int = 64
    output_factor: int = 4
    #: Iterations of a Loop that only its trip count ends (a constant M with a condition that stays true).
    max_loop_trips: int = 1 << 20
    #: Wall seconds of each numeric verification child (choosing shapes, comparing the models).
    verify_seconds: float = 120.0
    #: Address space of each verification child in MiB; 0: no limit of its own.
    verify_memory_mb: int = 4096

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            low = 0 if item.name == "verify_memory_mb" else 1
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < low:
                raise OptionsError(f"limit {item.name} must be a number of at least {low}, not {value!r}",
                                   field="limits")

    @property
    def max_tensor_bytes(self) -> int:
        return self.max_tensor_mb * MiB

    @property
    def max_folded_bytes(self) -> int:
        return self.max_folded_mb * MiB

    def output_limit(self, input_bytes: int) -> int:
        """Bytes of weights the optimized model may hold: max(``max_output_mb``, ``output_factor`` x input)."""
        return max(self.max_output_mb * MiB, self.output_factor * max(int(input_bytes), 0))

    def check_tensor(self, where: str, shape_or_count: Sequence[int] | int, itemsize: int) -> None:
        """Refuse a tensor of this shape (or element count) and element size beyond the tensor limits."""
        count = shape_or_count if isinstance(shape_or_count, int) else math.prod(int(d) for d in shape_or_count)
        if count > self.max_tensor_elements:
            raise LimitError(f"{where} would create a tensor of {count:,} elements, above the limit of "
                             f"{self.max_tensor_elements:,} ({_flag('max_tensor_elements')})")
        if count * itemsize > self.max_tensor_bytes:
            raise LimitError(f"{where} would create a tensor of {size_text(count * itemsize)}, above the limit "
                             f"of {size_text(self.max_tensor_bytes)} ({_flag('max_tensor_mb')})")

    def check_loop(self, where: str, trips: int) -> None:
        if trips > self.max_loop_trips:
            raise LimitError(f"{where} runs {trips:,} iterations (only its trip count ends it), above the limit "
                             f"of {self.max_loop_trips:,} ({_flag('max_loop_trips')})")

    def check_output(self, weight_bytes: int, input_bytes: int) -> None:
        limit = self.output_limit(input_bytes)
        if weight_bytes > limit:
            raise LimitError(f"the optimized model would hold {size_text(weight_bytes)} of weights, above the "
                             f"output limit of {size_text(limit)} (the larger of {self.max_output_mb} MiB and "
                             f"{self.output_factor} x the input's {size_text(input_bytes)}; "
                             f"{_flag('max_output_mb')})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def raised(self, assignments: Sequence[str]) -> "Limits":
        """These limits with ``NAME=VALUE`` assignments applied (the command line's ``--limit``)."""
        known = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for text in assignments:
            name, sep, raw = text.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in known:
                raise OptionsError(f"bad limit {text!r}: expected NAME=VALUE with NAME one of "
                                   f"{', '.join(known)}", field="limits")
            try:
                changes[name] = float(raw) if name == "verify_seconds" else int(raw)
            except ValueError:
                raise OptionsError(f"bad limit {text!r}: VALUE must be a number", field="limits") from None
        return replace(self, **changes)


def _flag(name: str) -> str:
    return f"limit {name}; raise it with --limit {name}=N"


def size_text(count: float) -> str:
    for unit, shift in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.0f} {unit}"
    return f"{count:.0f} bytes"


def describe_node(node) -> str:
    """How a refusal names a node: its op type and name (escaped), and the graph it is in when nested."""
    name = printable(node.name) if node.name else "(unnamed)"
    return f"node {name} ({node.op_type})"


def printable(text: str, limit: int = 200) -> str:
    """``text`` quoted with control and non-printable characters escaped, shortened: safe for a terminal."""
    shown = repr(str(text))
    return shown if len(shown) <= limit else shown[:limit - 4] + "...'"


def elements_from_values(op_type: str, data_shape: Sequence[int] | None, values: Sequence[Any]) -> int | None:
    """Elements of the output of an op sized by values (``SIZED_BY_VALUE``) before computing it, or None when
    they do not follow from what is known. ``values`` are the op's inputs as arrays (None where unknown);
    ``data_shape`` is input 0's shape (Expand, Tile), which need not be known by value. Python integers, so a
    hostile shape cannot wrap around int64 into a small count."""
    try:
        if op_type == "ConstantOfShape" and values and values[0] is not None:
            dims = [int(d) for d in np.reshape(values[0], -1)]
            return math.prod(dims) if min(dims, default=0) >= 0 else None
        if op_type in ("Expand", "Tile") and data_shape is not None and len(values) > 1 and values[1] is not None:
            other = [int(d) for d in np.reshape(values[1], -1)]
            if op_type == "Tile":
                return math.prod(int(d) for d in data_shape) * math.prod(other) if min(other, default=0) >= 0 \
                    else None
            rank = max(len(data_shape), len(other))
            padded = [1] * (rank - len(data_shape)) + [int(d) for d in data_shape]
            wanted = [1] * (rank - len(other)) + other
            return math.prod(max(a, b) if 1 in (a, b) else a for a, b in zip(padded, wanted))
        if op_type == "Range" and len(values) >= 3 and all(v is not None for v in values[:3]):
            start, limit, delta = (float(np.asarray(v).reshape(())) for v in values[:3])
            if not all(math.isfinite(x) for x in (start, limit, delta)):
                return 2**63  # an infinite range: beyond every limit
            return max(0, math.ceil((limit - start) / delta)) if delta else None
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    return None
