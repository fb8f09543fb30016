"""Scalar scales that travel: a Mul (or Div) by one constant value moves along a path of ops that commute
with scaling until a Conv, Gemm or MatMul with constant weights absorbs it (NNVM FoldScaleAxis's
pass-through kinds, for the scalar case).

    backward: Mul(Transpose(Reshape(MatMul(x, W) + b)) @ K, 0.125)   ->  Transpose(Reshape(MatMul(x, W * 0.125)
                                                                          + b * 0.125)) @ K
    forward:  MatMul(x * Mul(a, 0.5), W)                             ->  MatMul(x * a, W * 0.5)

The first is a transformer's attention scale, the second the 0.5 of an exported Gelu. Ops passed through:
Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Identity (any direction), Mul and MatMul of two activations
(either operand), and backward an Add of a constant (which is scaled too). Every value on the path must have
exactly one consumer and not be a graph output, so nothing else sees the values change by the factor; they
get new names, as they hold other values now (verification by regions pairs values by name).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext
from worker.engine.passes.support.weights import cast_like, f64, factor_refusal
from worker.engine.pattern import Match, Pattern, Rule, describe

SHAPE_ONLY = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
MAX_STEPS = 32


@dataclass
class Plan:
    """Which constants to multiply by the factor: (node, input slot) pairs."""

    scaled: list[tuple[Node, int]] = field(default_factory=list)
    #: The values on the path, which hold another value once the factor has moved (renamed by ``apply``).
    changed: list[Value] = field(default_factory=list)


def _float_constant(value: Value | None) -> bool:
    data = None if value is None else value.constant_value()
    return data is not None and data.dtype in (np.float16, np.float32, np.float64) and not _quantized(value)


def _quantized(value: Value) -> bool:
    return value.producer is not None and value.producer.op_type == "DequantizeLinear"


def _private(value: Value) -> bool:
    return not value.is_graph_output and len(value.uses) == 1


def backward(value: Value, budget: list[int] | None = None) -> Plan | None:
    """How to multiply ``value`` by the factor by changing constants upstream, or None.

    ``budget`` bounds the ops visited (the search branches at every MatMul or Mul of two activations).
    """
    plan = _backward(value, budget)
    if plan is not None:
        plan.changed.append(value)
    return plan


def _backward(value: Value, budget: list[int] | None) -> Plan | None:
    budget = [MAX_STEPS] if budget is None else budget
    budget[0] -= 1
    node = value.producer
    if node is None or node.domain or budget[0] < 0 or not _private(value) or value.producer_slot != 0:
        return None
    if node.op_type in SHAPE_ONLY:
        return backward(node.input(0), budget) if node.input(0) is not None else None
    if node.op_type in ("Conv", "ConvTranspose", "Gemm") and _float_constant(node.input(1)):
        bias = node.input(2)
        if bias is not None and not _float_constant(bias):
            return None
        return Plan([(node, 1)] + ([(node, 2)] if bias is not None else []))
    if node.op_type in ("MatMul", "Mul"):
        for slot in (1, 0):
            if _float_constant(node.input(slot)):
                return Plan([(node, slot)])
        return _first(backward(node.input(slot), budget) for slot in (0, 1))
    if node.op_type in ("Add", "Sub"):
        for slot in (1, 0):
            other = node.input(1 - slot)
            if _float_constant(node.input(slot)) and other is not None:
                upstream = backward(other, budget)
                return None if upstream is None else Plan(upstream.scaled + [(node, slot)], upstream.changed)
    return None


def forward(value: Value, steps: int = 0) -> Plan | None:
    """How to absorb a factor carried by ``value`` by changing constants downstream, or None."""
    plan = _forward(value, steps)
    if plan is not None:
        plan.changed.append(value)
    return plan


def _forward(value: Value, steps: int) -> Plan | None:
    if steps > MAX_STEPS or not _private(value):
        return None
    node, slot = value.uses[0]
    if node.domain:
        return None
    if node.op_type in SHAPE_ONLY and slot == 0:
        return forward(node.output(0), steps + 1)
    if node.op_type in ("Conv", "ConvTranspose", "Gemm") and slot == 0 and _float_constant(node.input(1)):
        return Plan([(node, 1)])
    if node.op_type in ("MatMul", "Mul") and slot in (0, 1):
        if _float_constant(node.input(1 - slot)):
            return Plan([(node, 1 - slot)])
        return forward(node.output(0), steps + 1)
    return None


def _first(plans) -> Plan | None:
    return next((p for p in plans if p is not None), None)


def apply(plan: Plan, factor: float) -> list[Value]:
    """Give every planned input a new constant scaled by ``factor``, and every value on the path a new name
    (it holds another value now: verification by regions pairs the two graphs' values by name, and a rewrite
    must not leave a name on what it changed); returns the replaced constants."""
    for value in dict.fromkeys(plan.changed):
        if value.graph is not None and value.producer is not None:
            value.graph.rename_fresh(value, f"{value.name}_rescaled")
    replaced = []
    for node, slot in plan.scaled:
        old = node.input(slot)
        data = old.constant_value()
        new = node.graph.add_initializer(f"{old.name}_scaled", cast_like(f64(data) * factor, data))
        node.set_input(slot, new)
        replaced.append(old)
    return replaced


class TravellingScale(Rule):
    """Mul/Div by a scalar constant, absorbed upstream (backward) or downstream (forward)."""

    pattern_args = ("op",)

    def __init__(self, op: str, direction: str):
        super().__init__()
        self.op, self.direction = op, direction
        self.name = f"scalar_{op.lower()}_{direction}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(self.op, p.var("x"), p.var("k").scalar(), key="scale", out="out", commutative=self.op == "Mul")
        return p

    def _factor(self, match: Match) -> float:
        """The factor the constants absorb (infinite for a Div by zero: ``check`` refuses that)."""
        value = float(f64(match.value("k").constant_value()).reshape(-1)[0])
        if self.op == "Mul":
            return value
        with np.errstate(divide="ignore", over="ignore"):
            return float(np.float64(1.0) / np.float64(value))

    def _plan(self, match: Match) -> Plan | None:
        x, out = match.value("x"), match.value("out")
        if x.shape is None or x.shape != out.shape or x.dtype != out.dtype:
            return None
        return backward(x) if self.direction == "backward" else forward(out)

    def check(self, ctx: PassContext, match: Match) -> Plan | str:
        if self.op == "Div" and self._factor(match) in (0.0, float("inf"), float("-inf")):
            return f"{describe(match.node('scale'))} divides by zero"
        plan = self._plan(match)
        if plan is None:
            return (f"no Conv, Gemm or MatMul with constant weights is reachable {self.direction} from "
                    f"{describe(match.node('scale'))} through single-use values and scale-commuting ops")
        refusal = factor_refusal(np.array(self._factor(match)), match.value("k").name,
                                 [node.input(slot).constant_value() for node, slot in plan.scaled])
        if refusal:
            return refusal
        if self.direction == "backward" and match.value("out").is_graph_output and not _can_rename(match):
            return f"the output of {describe(match.node('scale'))} is a graph output that cannot be renamed"
        return plan

    def rewrite(self, ctx: PassContext, match: Match, plan: Plan) -> list[Node]:
        x, out, graph = match.value("x"), match.value("out"), match.graph
        graph.remove_unused(apply(plan, self._factor(match)))
        if not graph.bypass(out, x):
            raise AssertionError("checked: bypass possible")
        return list(dict.fromkeys(node for node, _ in plan.scaled))  # traced as where the factor went


def _can_rename(match: Match) -> bool:
    x = match.value("x")
    return x.producer is not None and x.graph is match.node("scale").graph and not x.is_graph_input
