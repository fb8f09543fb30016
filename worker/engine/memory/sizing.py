"""Byte sizes of values from inferred shapes, with the user's dim bounds, and why a size stays unknown.

A dim the user did not fix stays symbolic; rather than guessing, the estimate names it. A bound
(``--dim-bound NAME=N``) may name a symbolic dim (every value carrying that dim is sized with N), or a value
whose size depends on the data, such as the output of NonZero (its unknown dims become N, and so do the
named dims it passes on downstream).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from onnx import TensorProto, helper

from worker.engine.errors import OptionsError
from worker.engine.ir import Graph, Node, Value

#: Bits per element of the packed sub-byte types; every other type uses numpy's item size.
_PACKED_BITS = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4}
for _name, _bits in (("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    if hasattr(TensorProto, _name):
        _PACKED_BITS[getattr(TensorProto, _name)] = _bits

def element_bits(dtype: int) -> int | None:
    """Bits per element, None for strings and undefined types (no fixed size)."""
    if dtype in _PACKED_BITS:
        return _PACKED_BITS[dtype]
    if dtype in (TensorProto.UNDEFINED, TensorProto.STRING):
        return None
    try:
        return 8 * helper.tensor_dtype_to_np_dtype(dtype).itemsize
    except (KeyError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Cause:
    """Why sizes are unknown: symbolic input dims, a data-dependent output, or a missing type.

    A value's size is data-dependent when every input of its node has a known size but its own does not
    (after type inference evaluated all it could): NonZero, NonMaxSuppression, Unique, a Reshape to a shape
    computed from data. Everything downstream inherits the cause.
    """

    kind: str  # "symbolic_dims", "computed_from_dims", "data_dependent", "untyped"
    key: str  # the dim name; the input, or the value whose size starts the unknown
    node: str = ""
    op: str = ""

    def reason(self) -> str:
        if self.kind == "symbolic_dims" and self.op == "graph input":
            return (f"graph input {self.key!r} has a dim with neither a value nor a name: give its static "
                    f"shape (--input-shape) or an upper bound (--dim-bound {self.key}=N)")
        if self.kind == "symbolic_dims":
            return (f"dim {self.key!r} of a graph input is symbolic: give static input shapes "
                    f"(--input-shape) or an upper bound (--dim-bound {self.key}=N)")
        if self.kind == "computed_from_dims":
            return (f"sizes computed from the value of {self.key!r} (through Shape) cannot follow its bound: "
                    f"give static input shapes (--input-shape)")
        if self.kind == "data_dependent":
            return (f"the size of {self.key!r} ({self.op} node {self.node!r}) depends on the input data: "
                    f"give an upper bound with --dim-bound {self.key}=N")
        return f"type inference found no shape or element type for {self.key!r} ({self.op} node {self.node!r})"


class Sizing:
    """Resolves shapes with the user's bounds and computes byte sizes."""

    def __init__(self, symbol_bounds: Mapping[str, int], value_bounds: Mapping[str, int]):
        self.symbol_bounds = dict(symbol_bounds)
        self.value_bounds = dict(value_bounds)
        self._nbytes: dict[str, int | None] = {}  # one Sizing serves one pass run over an unchanging graph

    @classmethod
    def from_bounds(cls, graph: Graph, bounds: Mapping[str, int]) -> "Sizing":
        """Sort each bound into a dim bound or a value bound; a name that is neither is an error."""
        symbols, open_values = _open_dims(graph)
        symbol_bounds = {k: v for k, v in bounds.items() if k in symbols}
        value_bounds: dict[str, int] = {}
        for name, bound in bounds.items():
            if name in symbol_bounds:
                continue
            value = open_values.get(name)
            if value is None:
                raise OptionsError(_unknown_bound_message(name, symbols, open_values), field="dim_bounds")
            value_bounds[name] = bound
            for dim in value.shape or ():
                if isinstance(dim, str) and dim not in bounds:
                    symbol_bounds[dim] = max(symbol_bounds.get(dim, 0), bound)
        return cls(symbol_bounds, value_bounds)

    def shape(self, value: Value) -> tuple | None:
        """The shape with bounds applied; unresolved dims stay str (named) or None."""
        if value.shape is None:
            return None
        bound = self.value_bounds.get(value.name)
        return tuple(d if isinstance(d, int) else bound if bound is not None else self.symbol_bounds.get(d, d)
                     if isinstance(d, str) else None
                     for d in value.shape)

    def nbytes(self, value: Value) -> int | None:
        """Exact bytes of a tensor value, None when a dim or the element size is unknown."""
        if value.name not in self._nbytes:
            self._nbytes[value.name] = self._compute_nbytes(value)
        return self._nbytes[value.name]

    def _compute_nbytes(self, value: Value) -> int | None:
        if value.type_proto is not None:
            return None
        shape = self.shape(value)
        bits = element_bits(value.dtype)
        if shape is None or bits is None or not all(isinstance(d, int) for d in shape):
            return None
        return -(-math.prod(shape) * bits // 8)


def applicable_bounds(graph: Graph, bounds: Mapping[str, int]) -> dict[str, int]:
    """The bounds that name a symbolic dim or a value of unknown size of ``graph`` as it is typed now (at a
    sample size, a bounded dim may be static)."""
    symbols, open_values = _open_dims(graph)
    return {name: bound for name, bound in bounds.items() if name in symbols or name in open_values}


def _open_dims(graph: Graph) -> tuple[set[str], dict[str, Value]]:
    """Symbolic dim names in use, and the values that have a dim that is not static."""
    symbols: set[str] = set()
    open_values: dict[str, Value] = {}
    for body in graph.all_graphs():
        for value in body.values():
            if value.shape is not None and not all(isinstance(d, int) for d in value.shape):
                open_values[value.name] = value
                symbols.update(d for d in value.shape if isinstance(d, str))
    return symbols, open_values


def _unknown_bound_message(name: str, symbols: set[str], open_values: Mapping[str, Value]) -> str:
    message = f"dim bound given for {name!r}, which is neither a symbolic dim nor a value of unknown size"
    if not symbols and not open_values:
        return message + "; every shape of the model is already static"
    names = sorted(symbols)[:10] + sorted(open_values)[:10]
    return message + f"; candidates: {', '.join(repr(n) for n in names)}"


def unknown_causes(graph: Graph, sizing: Sizing, outer: Mapping[str, frozenset[Cause]] = {},
                   outer_content: Mapping[str, frozenset[Cause]] = {}
                   ) -> tuple[dict[str, frozenset[Cause]], dict[str, frozenset[Cause]]]:
    """For every value of ``graph`` without a size, the causes it inherits or starts.

    Sizes also depend on values computed from shapes (Shape -> Gather -> Concat -> Reshape), so a second
    map follows the symbolic dims that flow through such values; a node whose output size is unknown while
    its inputs' sizes are known inherits those, and only without them is its output data-dependent.
    Returns (size causes, content causes).
    """
    causes: dict[str, frozenset[Cause]] = dict(outer)
    content: dict[str, frozenset[Cause]] = dict(outer_content)
    for value in graph.inputs:
        if sizing.nbytes(value) is None and not value.is_initializer:
            causes[value.name] = _input_causes(value, sizing)
    for node in graph:
        reads = list(_reads(node))
        inherited = frozenset().union(*(causes.get(v.name, frozenset()) for v in reads))
        carried = frozenset().union(*(content.get(v.name, frozenset()) for v in reads))
        if node.domain == "" and node.op_type in ("Shape", "Size") and node.input(0) is not None:
            carried |= _shape_causes(node.input(0), sizing, causes)
        for value in node.outputs:
            if carried:
                content[value.name] = carried
            if is_computed(value) and sizing.nbytes(value) is None:
                causes[value.name] = inherited or carried or frozenset({_origin(node, value)})
    return causes, content


def is_computed(value: Value) -> bool:
    """False for an omitted optional output (the reader names it unused_output...): nothing computes it."""
    return value.is_used or not value.name.startswith("unused_output")


def _shape_causes(value: Value, sizing: Sizing, causes: Mapping[str, frozenset[Cause]]) -> frozenset[Cause]:
    """Why the shape of ``value``, read as data, is not known at optimization time."""
    if value.shape is not None and all(isinstance(d, int) for d in value.shape):
        return frozenset()
    if value.name in causes:
        return causes[value.name]
    named = frozenset(Cause("computed_from_dims", d) for d in value.shape or () if isinstance(d, str))
    return named or frozenset({Cause("computed_from_dims", value.name)})


def _reads(node: Node) -> Iterable[Value]:
    """Values a node reads, those its bodies read from outside included."""
    yield from (v for v in node.inputs if v is not None)
    for body in node.subgraphs():
        for inner in body.all_nodes():
            yield from (v for v in inner.inputs if v is not None)


def _input_causes(value: Value, sizing: Sizing) -> frozenset[Cause]:
    shape = sizing.shape(value)
    if shape is None or element_bits(value.dtype) is None:
        return frozenset({Cause("untyped", value.name, "", "graph input")})
    return frozenset(Cause("symbolic_dims", d) if isinstance(d, str) else
                     Cause("symbolic_dims", value.name, "", "graph input")
                     for d in shape if not isinstance(d, int))


def _origin(node: Node, value: Value) -> Cause:
    if value.type_proto is None and value.shape is not None and element_bits(value.dtype) is not None:
        return Cause("data_dependent", value.name, node.name, node.op_type)
    return Cause("untyped", value.name, node.name, node.op_type)
