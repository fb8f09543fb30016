"""Live intervals over a fixed execution order, with in-place aliasing, and the live-bytes profile.

The input is plain data (a list of steps and facts per value), so the same code serves the top graph, every
If/Loop body and hand-written tests. Values that share memory are merged into one buffer:

- A view (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout's first output, io_copy inside one memory
  space) always reuses its input's buffer: the bytes are the same, only the shape or the place label changes.
- An elementwise op (standard, or a mirserve ``Fused<Add|Mul|...><Act>``) may write over one of its inputs
  only when that is the input buffer's last use (no view of it is read later either), sizes and dtypes
  match, that input is not broadcast (its shape is the output's; a broadcast *other* operand, such as a
  bias, does not matter), both sit in the same space, and neither side is a graph input, graph output or
  initializer. Every refusal is kept with its reason.

A buffer that contains a graph input, output, initializer or constant lives in memory the arena does not own,
so it is reported apart (io and weights) and not planned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from worker.engine.memory.plan import Buffer, LiveProfile, aligned

#: Ops whose first output is their first input's bytes under another shape.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})

#: The place-cast op that moves a value between targets; a view when both targets share memory.
IO_COPY = ("mirserve", "io_copy")

#: Ops that compute each output element from the same-position input elements (after broadcasting).
ELEMENTWISE_OPS = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitwiseAnd", "BitwiseNot",
    "BitwiseOr", "BitwiseXor", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div", "Elu", "Erf", "Exp", "Floor",
    "Gelu", "HardSigmoid", "HardSwish", "LeakyRelu", "Log", "Max", "Mean", "Min", "Mish", "Mod", "Mul",
    "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin",
    "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Where", "Xor",
})


@dataclass(frozen=True)
class ValueFacts:
    """What liveness needs to know about one value.

    ``nbytes`` is the exact (unaligned) size, None when a dim is unknown. ``role`` says why the value is not
    the arena's to place ("graph input", "graph output", "initializer", "constant"), None for an
    intermediate.
    """

    name: str
    nbytes: int | None
    dtype: int | str | None = None
    shape: tuple | None = None
    space: str = "host"
    role: str | None = None


@dataclass(frozen=True)
class Step:
    """One node of the execution order. ``inputs`` may hold "" for an omitted optional input."""

    node: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    domain: str = ""
    #: Outer-scope values read inside the node's subgraphs: they must stay live until this step.
    implicit_inputs: tuple[str, ...] = ()
    #: Extra bytes per space the node needs while it runs (the arena of its If/Loop bodies).
    scratch: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class InPlaceDecision:
    node: str
    input: str
    output: str
    accepted: bool
    #: Short name of the rule that decided ("accepted", "graph output", "read later", "broadcast", ...).
    rule: str
    reason: str


@dataclass(frozen=True)
class Interval:
    """One buffer before placement: its member values, live steps, space and exact size (None: unknown)."""

    id: str
    values: tuple[str, ...]
    first: int
    last: int
    space: str
    nbytes: int | None

    def to_buffer(self) -> Buffer:
        if self.nbytes is None:
            raise ValueError(f"buffer {self.id!r} has no known size and cannot be planned")
        return Buffer(self.id, aligned(self.nbytes), self.first, self.last, self.space)


@dataclass(frozen=True)
class Liveness:
    steps: int
    intervals: tuple[Interval, ...]
    #: Value name -> id of the buffer it lives in, for every planned-or-unsized intermediate.
    buffer_of: Mapping[str, str]
    #: Buffers in memory the arena does not own: their member values.
    external: tuple[tuple[str, ...], ...]
    decisions: tuple[InPlaceDecision, ...]


#: Elementwise ops the mirserve domain fuses with an activation (FusedAddRelu, ...): elementwise as a whole.
FUSABLE_ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Sum")


def is_elementwise_op(op_type: str, domain: str) -> bool:
    if domain in ("", "ai.onnx"):
        return op_type in ELEMENTWISE_OPS
    return domain == "mirserve" and op_type.startswith("Fused") and op_type[5:].startswith(FUSABLE_ELEMENTWISE)


def is_view_op(op_type: str, domain: str) -> bool:
    """True when the op's first output is its first input's bytes (io_copy: when both sides share memory)."""
    return (domain, op_type) == IO_COPY or (op_type in VIEW_OPS and domain in ("", "ai.onnx"))


def live_profile(buffers: Iterable[Buffer], steps: int | None = None) -> LiveProfile:
    """Live bytes at every step; the first step reaching the maximum is the peak."""
    buffers = list(buffers)
    if steps is None:
        steps = max((b.last + 1 for b in buffers), default=0)
    delta = [0] * (steps + 1)
    for buffer in buffers:
        if buffer.last >= steps:
            raise ValueError(f"buffer {buffer.id!r} is live at step {buffer.last}, past the last step")
        delta[buffer.first] += buffer.size
        delta[buffer.last + 1] -= buffer.size
    timeline, live = [], 0
    for change in delta[:steps]:
        live += change
        timeline.append(live)
    peak = max(timeline, default=0)
    return LiveProfile(tuple(timeline), peak, timeline.index(peak) if timeline else 0)


def analyze(steps: Sequence[Step], facts: Mapping[str, ValueFacts]) -> Liveness:
    """Merge aliased values into buffers and give each buffer its live interval."""
    return _Analysis(steps, facts).run()


class _Group:
    """Values sharing one buffer while liveness is computed."""

    __slots__ = ("values", "first", "last", "space", "nbytes", "role")

    def __init__(self, facts: ValueFacts, first: int, last: int):
        self.values = [facts.name]
        self.first, self.last = first, last
        self.space, self.nbytes, self.role = facts.space, facts.nbytes, facts.role


class _Analysis:
    def __init__(self, steps: Sequence[Step], facts: Mapping[str, ValueFacts]):
        self.steps, self.facts = steps, facts
        self.last_use: dict[str, int] = {}
        for index, step in enumerate(steps):
            for name in (*step.inputs, *step.implicit_inputs):
                if name:
                    self.last_use[name] = index
        self.group_of: dict[str, _Group] = {}
        self.groups: list[_Group] = []
        self.decisions: list[InPlaceDecision] = []

    def run(self) -> Liveness:
        for index, step in enumerate(self.steps):
            for slot, name in enumerate(step.outputs):
                if name:
                    self._place_output(index, step, slot, name)
        intervals = [self._interval(g) for g in self.groups if g.role is None]
        intervals += self._scratch_intervals()
        intervals.sort(key=lambda i: (i.first, i.id))
        return Liveness(
            steps=len(self.steps), intervals=tuple(intervals),
            buffer_of={v: i.id for i in intervals for v in i.values},
            external=tuple(tuple(g.values) for g in self.groups if g.role is not None),
            decisions=tuple(self.decisions))

    def _facts(self, name: str) -> ValueFacts:
        return self.facts.get(name) or ValueFacts(name, None)

    def _group(self, name: str) -> _Group:
        """The group of ``name``; a value no step produces (graph input, weight, outer value) is external."""
        group = self.group_of.get(name)
        if group is None:
            facts = self._facts(name)
            group = _Group(facts, 0, 0)
            group.role = facts.role or "value from outside this graph"
            self.group_of[name] = group
            self.groups.append(group)
        return group

    def _place_output(self, index: int, step: Step, slot: int, name: str) -> None:
        facts = self._facts(name)
        source = self._view_source(step, slot, facts) or self._in_place_source(index, step, slot, facts)
        if source is None:
            group = _Group(facts, index, self.last_use.get(name, index))
            self.groups.append(group)
        else:
            group = self._group(source)
            group.values.append(name)
            group.last = max(group.last, self.last_use.get(name, index))
            group.role = group.role or facts.role
        self.group_of[name] = group

    def _view_source(self, step: Step, slot: int, out: ValueFacts) -> str | None:
        """The input a view output aliases, if this output is a view."""
        if slot != 0 or not step.inputs or not step.inputs[0] or not is_view_op(step.op_type, step.domain):
            return None
        source = self._facts(step.inputs[0])
        if source.space != out.space:
            return None
        if source.nbytes is not None and out.nbytes is not None and source.nbytes != out.nbytes:
            return None
        return source.name

    def _in_place_source(self, index: int, step: Step, slot: int, out: ValueFacts) -> str | None:
        """The first input the elementwise output may overwrite; every refusal is recorded."""
        if slot != 0 or not is_elementwise_op(step.op_type, step.domain):
            return None
        for name in dict.fromkeys(n for n in step.inputs if n):
            refusal = self._in_place_refusal(index, name, out)
            rule, reason = refusal or ("accepted", "last use, same size, element type and shape")
            self.decisions.append(InPlaceDecision(step.node, name, out.name, refusal is None, rule, reason))
            if refusal is None:
                return name
        return None

    def _in_place_refusal(self, index: int, name: str, out: ValueFacts) -> tuple[str, str] | None:
        """(rule, sentence) saying why ``out`` may not overwrite input ``name`` at step ``index``."""
        source, group = self._facts(name), self._group(name)
        if out.role is not None:
            return out.role, f"the output {out.name!r} is a {out.role}"
        if group.role is not None:
            if group.values[0] == name:
                return group.role, f"the input {name!r} is a {group.role}"
            return group.role, f"the input {name!r} is a view of {group.values[0]!r}, a {group.role}"
        if group.last > index:
            return "read later", (f"the input {name!r} is read again at step {group.last} "
                                  f"(node {self.steps[group.last].node!r})")
        if source.space != out.space:
            return "memory space", (f"the input {name!r} is in memory space {source.space!r}, "
                                    f"the output in {out.space!r}")
        if source.dtype != out.dtype:
            return "element type", f"the input {name!r} has element type {source.dtype}, the output {out.dtype}"
        if source.nbytes is None or out.nbytes is None:
            return "size unknown", f"the size of {name!r} or {out.name!r} is not known"
        if source.shape != out.shape:
            return "broadcast", (f"the input {name!r} of shape {_shape_text(source.shape)} is broadcast to "
                                 f"{_shape_text(out.shape)}")
        if source.nbytes != out.nbytes:
            return "size", f"the input {name!r} has {source.nbytes} bytes, the output {out.nbytes}"
        return None

    def _interval(self, group: _Group) -> Interval:
        return Interval(group.values[0], tuple(group.values), group.first, group.last, group.space,
                        group.nbytes)

    def _scratch_intervals(self) -> list[Interval]:
        return [Interval(f"{step.node}:scratch:{space}", (), index, index, space, size)
                for index, step in enumerate(self.steps)
                for space, size in sorted(step.scratch.items()) if size]


def _shape_text(shape: tuple | None) -> str:
    return "unknown" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"
