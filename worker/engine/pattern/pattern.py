"""Patterns: op and var pattern nodes with assertions, written as expressions over vars.

    p = Pattern("conv_bn")
    y = p.op(("Conv", "ConvTranspose"), p.var("x"), p.var("w"), key="conv", out="y")
    p.BatchNormalization(y, key="bn", out="out")

``p.Op(...)`` is ``p.op("Op", ...)``: it declares an op pattern reading the given vars (None leaves an input
slot unconstrained) and returns the var of its output (a tuple for ``outputs=n``), so a pattern reads like
the computation it matches. ``key`` names the op and ``out`` its output for the rule that reads the match
(unnamed ones get a key of their own). As in Paddle-Lite's pattern matcher, a var that a pattern op produces
*and* a pattern op consumes is an intermediate: no node outside the match may read it, because the rewrite
replaces the ops producing it; ``keep()`` allows outside readers (the op then stays as long as one reads it).
A var only consumed is a kept input, a var only produced an output of the pattern.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping

from worker.engine.ir import Node, Value

Predicate = Callable[[Any], bool]


class VarPattern:
    def __init__(self, pattern: "Pattern", key: str):
        self.pattern = pattern
        self.key = key
        self.assertions: list[tuple[str, Predicate]] = []
        self.producer: tuple[OpPattern, int] | None = None
        self.consumers: list[tuple[OpPattern, int]] = []
        self._keep = False
        #: A constant leaf: it may bind a value another such var binds (one Constant 1.0 read twice).
        self.shared_constant = False

    def __repr__(self) -> str:
        return f"VarPattern({self.key!r})"

    def check(self, description: str, predicate: Callable[[Value], bool]) -> "VarPattern":
        self.assertions.append((description, predicate))
        return self

    def const(self) -> "VarPattern":
        """Known at optimization time: a non-input initializer or a Constant node's output. Two such vars may
        bind the same value (an exporter's one Constant 1.0 read by two Adds of a chain)."""
        self.shared_constant = True
        return self.check("is constant", lambda v: v.constant_value() is not None)

    def scalar(self) -> "VarPattern":
        """A constant holding one value."""
        return self.check("is one constant value", lambda v: (c := v.constant_value()) is not None and c.size == 1)

    def keep(self) -> "VarPattern":
        """Let nodes outside the match read this var even though the pattern both produces and consumes it."""
        self._keep = True
        return self

    @property
    def is_intermediate(self) -> bool:
        return self.producer is not None and bool(self.consumers) and not self._keep

    def accepts(self, value: Value) -> bool:
        return all(predicate(value) for _, predicate in self.assertions)


class OpPattern:
    def __init__(self, key: str, types: frozenset[str], domain: str, commutative: bool, binds_outputs: bool = True):
        self.key = key
        self.binds_outputs = binds_outputs
        self.types = types
        self.domain = domain
        self.commutative = commutative
        self.assertions: list[tuple[str, Predicate]] = []
        self.inputs: dict[int, VarPattern] = {}
        self.outputs: dict[int, VarPattern] = {}

    def __repr__(self) -> str:
        return f"OpPattern({self.key!r}, {sorted(self.types)})"

    def accepts(self, node: Node) -> bool:
        return node.op_type in self.types and node.domain == self.domain and \
            all(predicate(node) for _, predicate in self.assertions)


class Pattern:
    def __init__(self, name: str):
        self.name = name
        self.vars: dict[str, VarPattern] = {}
        self.ops: dict[str, OpPattern] = {}

    def __getattr__(self, op_type: str):
        """``p.Conv(x, w, ...)``: ``p.op("Conv", x, w, ...)`` for any op type (names start upper case)."""
        if not op_type[:1].isupper():
            raise AttributeError(op_type)
        return lambda *inputs, **options: self.op(op_type, *inputs, **options)

    def var(self, key: str) -> VarPattern:
        self._claim(key)
        self.vars[key] = VarPattern(self, key)
        return self.vars[key]

    def op(self, types: str | Iterable[str], *inputs: VarPattern | None, key: str | None = None,
           out: str | Iterable[str] | None = None, outputs: int = 1, domain: str = "",
           commutative: bool = False, attrs: Mapping[str, Any] | None = None,
           when: Callable[[Node], bool] | None = None) -> VarPattern | tuple[VarPattern, ...] | None:
        """Declare an op pattern reading ``inputs`` (by slot; None leaves a slot free) and return its output var.

        ``types`` is one op type or several alternatives; ``commutative`` lets inputs 0 and 1 match in either
        order; ``attrs`` asserts attribute values (an absent attribute reads as None); ``when`` is a predicate
        on the node, described by its docstring. ``outputs=n`` binds the first n outputs and returns them all;
        the node's other outputs must be unused. ``outputs=0`` binds none and leaves them all to the rule
        (a Split whose one used output becomes a Slice), and returns None.
        """
        kinds = frozenset([types] if isinstance(types, str) else types)
        key = key or self._fresh_key(_snake(sorted(kinds)[0]))
        self._claim(key)
        op = OpPattern(key, kinds, domain, commutative, binds_outputs=outputs > 0)
        for name, expected in (attrs or {}).items():
            op.assertions.append((f"{name} == {expected!r}", lambda n, name=name, expected=expected:
                                  _normal(n.attr(name)) == _normal(expected)))
        if when is not None:
            op.assertions.append(((when.__doc__ or when.__name__).strip(), when))
        for slot, var in enumerate(inputs):
            if var is not None:
                op.inputs[slot] = var
                var.consumers.append((op, slot))
        names = [out] if isinstance(out, str) else list(out or [])
        results = []
        for slot in range(outputs):
            var = self.var(names[slot] if slot < len(names) else self._fresh_key(f"{key}:{slot}"))
            op.outputs[slot] = var
            var.producer = (op, slot)
            results.append(var)
        self.ops[key] = op
        return None if outputs == 0 else results[0] if outputs == 1 else tuple(results)

    @property
    def output(self) -> VarPattern | None:
        """The var the pattern computes: produced by a pattern op and read by none (None unless exactly one)."""
        found = [v for v in self.vars.values() if v.producer is not None and not v.consumers]
        return found[0] if len(found) == 1 else None

    def _claim(self, key: str) -> None:
        if key in self.vars or key in self.ops:
            raise ValueError(f"pattern {self.name!r} already has a node {key!r}")

    def _fresh_key(self, base: str) -> str:
        key, n = base, 1
        while key in self.vars or key in self.ops:
            n += 1
            key = f"{base}_{n}"
        return key


def _snake(op_type: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


def _normal(value: Any) -> Any:
    """Attribute values compared alike whether read as tuples, lists or bytes."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value
