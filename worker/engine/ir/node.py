"""Nodes of the SSA graph and their attributes.

Inputs are set only through ``set_input``/``replace_inputs`` so that every value's ``uses`` stays exact.
Attributes stay as they were read from the file until a pass reads or changes one: an untouched attribute is
written back byte for byte, and a graph attribute is an IR ``Graph`` whose nodes may use outer values.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from onnx import AttributeProto, helper

from worker.engine.ir.journal import created, journaled, touch, tracked
from worker.engine.ir.tensors import to_array
from worker.engine.ir.value import Use, Value

if TYPE_CHECKING:
    from worker.engine.ir.graph import Graph
    from worker.engine.kernels.pick import Pick
    from worker.engine.places import Place

A = AttributeProto


class Attr:
    """One attribute: its ONNX type and its Python value (int, float, str, lists, ndarray, Graph, ...)."""

    __slots__ = ("name", "type", "_value", "_proto", "ref_attr_name")

    def __init__(self, name: str, type_: int, value: Any = None, *, proto: AttributeProto | None = None):
        self.name = name
        self.type = type_
        self._value = value
        self._proto = proto  # the attribute as read, kept until the value is replaced
        self.ref_attr_name = proto.ref_attr_name if proto is not None else ""

    @classmethod
    def infer(cls, name: str, value: Any) -> "Attr":
        """Build an attribute from a Python value, choosing the ONNX type from it."""
        from worker.engine.ir.graph import Graph

        if isinstance(value, Graph):
            return cls(name, A.GRAPH, value)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, Graph) for v in value):
            return cls(name, A.GRAPHS, list(value))
        if isinstance(value, np.ndarray):
            return cls(name, A.TENSOR, value)
        proto = helper.make_attribute(name, value)
        return cls(name, proto.type, helper.get_attribute_value(proto), proto=proto)

    @property
    def value(self) -> Any:
        if self._value is None and self._proto is not None:
            self._value = _decode(self._proto)
        return self._value

    @property
    def proto(self) -> AttributeProto | None:
        """The attribute as read from the file, if it was never changed (graphs are always re-encoded)."""
        return self._proto if self.type not in (A.GRAPH, A.GRAPHS) else None

    def __repr__(self) -> str:
        return f"Attr({self.name!r}, {self.value!r})"


def _decode(proto: AttributeProto) -> Any:
    if proto.type == A.TENSOR:
        array = to_array(proto.t)
        array.flags.writeable = False
        return array
    if proto.type == A.TENSORS:
        return [to_array(t) for t in proto.tensors]
    if proto.type == A.STRING:
        return _text(proto.s)
    if proto.type == A.STRINGS:
        return [_text(s) for s in proto.strings]
    return helper.get_attribute_value(proto)


def _text(data: bytes) -> str | bytes:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


#: The fields of a Node in the order of its journal state.
_STATE_SLOTS = ("op_type", "domain", "name", "attributes", "_inputs", "outputs", "doc_string", "metadata", "graph",
                "pick", "overload", "_prev", "_next", "_order")


@journaled
class Node:
    """An op application. ``pick`` is set by kernel pick (and on every cast); ``metadata`` is written out."""

    __slots__ = ("op_type", "domain", "name", "attributes", "_inputs", "outputs", "doc_string", "metadata",
                 "graph", "pick", "overload", "_prev", "_next", "_order")
    _is_node = True

    def __init__(self, op_type: str, inputs: Iterable[Value | None] = (), outputs: Iterable[Value] = (), *,
                 domain: str = "", name: str = "", attributes: dict[str, Attr] | None = None):
        created(self)
        # Fields set past the journal's __setattr__ (a node being made has nothing to save; a pass makes many):
        # name -> Attr and key -> value pairs written to the file (``mirserve.kernel``, ``mirserve.place``) are
        # dicts that tell the journal before they change; ``pick`` is the kernel this node runs on, resolved
        # against it, None until the node is placed.
        for slot, value in zip(_STATE_SLOTS, (op_type, domain, name, tracked(attributes), [], [], "",
                                              tracked(None), None, None, "", None, None, 0)):
            object.__setattr__(self, slot, value)
        self.op_type: str
        self.attributes: dict[str, Attr]
        self.metadata: dict[str, str]
        self.graph: Graph | None
        self.pick: Pick | None
        for value in inputs:
            self._append_input(value)
        for slot, value in enumerate(outputs):
            self._attach_output(value, slot)

    def __repr__(self) -> str:
        kind = f"{self.domain}.{self.op_type}" if self.domain else self.op_type
        return f"Node({kind} {self.name!r})"

    @property
    def place(self) -> "Place | None":
        """Where the node runs: its pick's target, precision and layout; None until placed."""
        return self.pick.place if self.pick is not None else None

    def _journal_state(self) -> tuple:
        """Every field; the lists copied (the attribute and metadata dicts save themselves when written)."""
        return (self.op_type, self.domain, self.name, self.attributes, list(self._inputs), list(self.outputs),
                self.doc_string, self.metadata, self.graph, self.pick, self.overload, self._prev, self._next,
                self._order)

    def _journal_restore(self, state: tuple) -> None:
        for slot, value in zip(_STATE_SLOTS, state):
            object.__setattr__(self, slot, value)

    # --- inputs and outputs -------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    def input(self, slot: int) -> Value | None:
        """The input at ``slot``, None when absent or beyond the given inputs (an omitted optional)."""
        return self._inputs[slot] if slot < len(self._inputs) else None

    def _append_input(self, value: Value | None) -> None:
        touch(self)
        touch(value)
        slot = len(self._inputs)
        self._inputs.append(value)
        if value is not None:
            value.uses.append(Use(self, slot))

    def set_input(self, slot: int, value: Value | None) -> None:
        touch(self)
        touch(value)
        touch(self.input(slot))
        while len(self._inputs) <= slot:
            self._inputs.append(None)
        old = self._inputs[slot]
        if old is not None:
            old.uses.remove(Use(self, slot))
        self._inputs[slot] = value
        if value is not None:
            value.uses.append(Use(self, slot))
        while self._inputs and self._inputs[-1] is None:
            self._inputs.pop()

    def replace_inputs(self, values: Iterable[Value | None]) -> None:
        touch(self)
        self.detach_inputs()
        for value in values:
            self._append_input(value)
        while self._inputs and self._inputs[-1] is None:
            self._inputs.pop()

    def detach_inputs(self) -> None:
        touch(self)
        for slot, value in enumerate(self._inputs):
            if value is not None:
                touch(value)
                value.uses.remove(Use(self, slot))
        self._inputs = []

    def _attach_output(self, value: Value, slot: int) -> None:
        if value.producer is not None:
            raise ValueError(f"value {value.name!r} already has a producer {value.producer!r}")
        value.producer, value.producer_slot = self, slot
        touch(self)
        self.outputs.append(value)

    def output(self, slot: int = 0) -> Value:
        return self.outputs[slot]

    # --- attributes ---------------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        found = self.attributes.get(name)
        return default if found is None else found.value

    def has_attr(self, name: str) -> bool:
        return name in self.attributes

    def set_attr(self, name: str, value: Any, type_: int | None = None) -> None:
        """Set an attribute; give ``type_`` for an empty list, whose ONNX type cannot be guessed."""
        if type_ is not None:
            self.attributes[name] = Attr(name, type_, value)
        else:
            self.attributes[name] = Attr.infer(name, value)
        self._adopt_subgraphs(self.attributes[name])
        if self.graph is not None:
            self.graph.note_bodies(self)

    def remove_attr(self, name: str) -> None:
        self.attributes.pop(name, None)
        if self.graph is not None:
            self.graph.note_bodies(self)

    def _adopt_subgraphs(self, attr: Attr) -> None:
        if attr.type == A.GRAPH:
            attr.value.parent = self
        elif attr.type == A.GRAPHS:
            for graph in attr.value:
                graph.parent = self

    def subgraphs(self) -> list["Graph"]:
        found = []
        for attr in self.attributes.values():
            if attr.type == A.GRAPH:
                found.append(attr.value)
            elif attr.type == A.GRAPHS:
                found.extend(attr.value)
        return found

    def constant_output(self) -> np.ndarray | None:
        """The tensor a Constant node produces, from whichever value attribute it carries."""
        for name, attr in self.attributes.items():
            if name == "value":
                return attr.value
            if name in ("value_float", "value_int"):
                dtype = np.float32 if name == "value_float" else np.int64
                return np.array(attr.value, dtype=dtype)
            if name in ("value_floats", "value_ints"):
                dtype = np.float32 if name == "value_floats" else np.int64
                return np.array(attr.value, dtype=dtype)
        return None

    # --- position -----------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """A number that orders nodes of one graph as they are listed (topologically once sorted)."""
        return self._order

    def is_op(self, op_type: str, domain: str = "") -> bool:
        return self.op_type == op_type and self.domain == domain
