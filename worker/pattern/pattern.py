"""Patterns: op and var pattern nodes with assertions, linked by input/output slots.

As in Paddle-Lite's pattern matcher, a var that a pattern op produces *and* a pattern op consumes is an
intermediate (removed by the rewrite) unless marked ``keep()``; a var only consumed is a kept input and a var
only produced a kept output. Pattern ops are intermediates: the rewrite replaces them.

    p = Pattern("conv_bn")
    x, w = p.var("x"), p.var("w").const()
    y = p.var("y")
    p.op("conv", "Conv", inputs=[x, w], outputs=[y])
    p.op("bn", "BatchNormalization", inputs=[y, p.var("scale").const(), ...], outputs=[p.var("out")])
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

from worker.ir import Node, Value

Predicate = Callable[[Any], bool]


class VarPattern:
    def __init__(self, pattern: "Pattern", key: str):
        self.pattern = pattern
        self.key = key
        self.assertions: list[tuple[str, Predicate]] = []
        self.producer: tuple[OpPattern, int] | None = None
        self.consumers: list[tuple[OpPattern, int]] = []
        self._keep = False

    def __repr__(self) -> str:
        return f"VarPattern({self.key!r})"

    def check(self, description: str, predicate: Callable[[Value], bool]) -> "VarPattern":
        self.assertions.append((description, predicate))
        return self

    def const(self) -> "VarPattern":
        """Known at optimization time: a non-input initializer or a Constant node's output."""
        return self.check("is constant", lambda v: v.constant_value() is not None)

    def initializer(self) -> "VarPattern":
        return self.check("is an initializer", lambda v: v.is_constant)

    def single_use(self) -> "VarPattern":
        return self.check("has one consumer", lambda v: v.has_single_consumer())

    def rank(self, rank: int) -> "VarPattern":
        return self.check(f"has rank {rank}", lambda v: v.rank == rank)

    def keep(self) -> "VarPattern":
        """Keep this var even though the pattern both produces and consumes it."""
        self._keep = True
        return self

    @property
    def is_intermediate(self) -> bool:
        return self.producer is not None and bool(self.consumers) and not self._keep


class OpPattern:
    def __init__(self, pattern: "Pattern", key: str, types: frozenset[str], domain: str, commutative: bool):
        self.pattern = pattern
        self.key = key
        self.types = types
        self.domain = domain
        self.commutative = commutative
        self.assertions: list[tuple[str, Predicate]] = []
        self.inputs: dict[int, VarPattern] = {}
        self.outputs: dict[int, VarPattern] = {}

    def __repr__(self) -> str:
        return f"OpPattern({self.key!r}, {sorted(self.types)})"

    def check(self, description: str, predicate: Callable[[Node], bool]) -> "OpPattern":
        self.assertions.append((description, predicate))
        return self

    def attr(self, name: str, expected: Any = None, *, default: Any = None,
             predicate: Predicate | None = None) -> "OpPattern":
        """Assert on an attribute: equal to ``expected``, or satisfying ``predicate``."""
        if predicate is None:
            return self.check(f"{name} == {expected!r}", lambda n: n.attr(name, default) == expected)
        return self.check(f"{name} matches", lambda n: predicate(n.attr(name, default)))

    def input_count(self, *counts: int) -> "OpPattern":
        return self.check(f"has {counts} inputs",
                          lambda n: sum(1 for _ in n.inputs) in counts)

    def accepts(self, node: Node) -> bool:
        return node.op_type in self.types and node.domain == self.domain and \
            all(pred(node) for _, pred in self.assertions)


class Pattern:
    def __init__(self, name: str):
        self.name = name
        self.vars: dict[str, VarPattern] = {}
        self.ops: dict[str, OpPattern] = {}

    def var(self, key: str) -> VarPattern:
        if key in self.vars or key in self.ops:
            raise ValueError(f"pattern {self.name!r} already has a node {key!r}")
        self.vars[key] = VarPattern(self, key)
        return self.vars[key]

    def op(self, key: str, types: str | Iterable[str], *, domain: str = "",
           inputs: Sequence[VarPattern | None] | Mapping[int, VarPattern] = (),
           outputs: Sequence[VarPattern | None] | Mapping[int, VarPattern] = (),
           commutative: bool = False) -> OpPattern:
        """An op pattern node. ``commutative`` lets inputs 0 and 1 match in either order."""
        if key in self.vars or key in self.ops:
            raise ValueError(f"pattern {self.name!r} already has a node {key!r}")
        kinds = frozenset([types] if isinstance(types, str) else types)
        op = OpPattern(self, key, kinds, domain, commutative)
        for slot, var in _slots(inputs):
            op.inputs[slot] = var
            var.consumers.append((op, slot))
        for slot, var in _slots(outputs):
            if var.producer is not None:
                raise ValueError(f"var {var.key!r} already has a producer in pattern {self.name!r}")
            op.outputs[slot] = var
            var.producer = (op, slot)
        self.ops[key] = op
        return op

    @property
    def anchor(self) -> OpPattern:
        """The op from which matching starts: the first declared one."""
        return next(iter(self.ops.values()))


def _slots(items) -> Iterable[tuple[int, VarPattern]]:
    pairs = items.items() if isinstance(items, Mapping) else enumerate(items)
    return [(slot, var) for slot, var in pairs if var is not None]
