"""Values of the SSA graph: each has one producer (a node, a graph input, or an initializer) and ordered uses.

Uses are kept only by the node input setters, so no edit ever needs a whole-graph cleanup. A use from a node
inside an If/Loop/Scan body counts like any other: a value used in a body is live.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import math

import numpy as np

from worker.engine.ir.journal import created, journaled, tracked

if TYPE_CHECKING:
    from onnx import TypeProto

    from worker.engine.ir.graph import Graph
    from worker.engine.ir.node import Node
    from worker.engine.places import Place

#: A dimension: an int when static, a str when symbolic (named), None when unknown.
Dim = int | str | None
Shape = tuple[Dim, ...]

#: How onnx's shape inference names a dim it makes up (``unk__0``): a name that says nothing about the dim.
MADE_UP = "unk__"


def nameable(dim: Dim) -> bool:
    """A dim of known size or of a name of the model's (not one onnx made up, ``MADE_UP``)."""
    return isinstance(dim, int) or (isinstance(dim, str) and not dim.startswith(MADE_UP))


def merged_shape(ours: Shape | None, theirs: Shape | None) -> Shape | None:
    """What two types of one tensor know together: at each position our dim unless theirs is nameable where
    ours is not (a number or a model's name over ``unk__N`` or unknown); ``ours`` where the ranks differ."""
    if theirs is None or (ours is not None and len(ours) != len(theirs)):
        return ours
    if ours is None:
        return theirs
    return tuple(t if nameable(t) and not nameable(o) else o for o, t in zip(ours, theirs))


class Use(NamedTuple):
    node: "Node"
    slot: int


#: The fields of a Value in the order of its journal state.
_STATE_SLOTS = ("name", "dtype", "shape", "type_proto", "producer", "producer_slot", "uses", "graph", "place",
                "doc_string", "metadata", "_const", "_source", "_output_count", "_is_input")


class ConstSource:
    """Where an initializer's data lives until something asks for it (lazy, without copies)."""

    dtype: int  # onnx element type
    shape: tuple[int, ...]
    nbytes: int

    def array(self) -> np.ndarray:
        raise NotImplementedError

    def release(self) -> None:
        """Drop what reading the data mapped into the resident set (nothing, unless the data is a mapped file)."""

    def take(self, positions: np.ndarray) -> np.ndarray | None:
        """The elements at these flat positions, read without mapping the data; None to read the array."""
        return None


@journaled
class Value:
    """A named tensor (or, rarely, a sequence/map/optional) flowing between nodes."""

    __slots__ = ("name", "dtype", "shape", "type_proto", "producer", "producer_slot", "uses", "graph",
                 "place", "doc_string", "metadata", "_const", "_source", "_output_count", "_is_input")

    def __init__(self, name: str, dtype: int = 0, shape: Shape | None = None):
        created(self)
        # Fields set past the journal's __setattr__ (a value being made has nothing to save; a pass makes many):
        # dtype is an onnx.TensorProto.DataType, 0 when unknown; shape None when the rank is unknown; type_proto
        # only for non-tensor types; _output_count is how many graph-output slots hold the value.
        for slot, value in zip(_STATE_SLOTS, (name, dtype, shape, None, None, 0, [], None, None, "", tracked(None),
                                              None, None, 0, False)):
            object.__setattr__(self, slot, value)
        self.dtype: int
        self.shape: Shape | None
        self.type_proto: TypeProto | None
        self.producer: Node | None
        self.uses: list[Use]
        self.graph: Graph | None
        self.place: Place | None
        self.metadata: dict[str, str]
        self._const: np.ndarray | None
        self._source: ConstSource | None

    def __repr__(self) -> str:
        return f"Value({self.name!r}, dtype={self.dtype}, shape={self.shape})"

    def _journal_state(self) -> tuple:
        return (self.name, self.dtype, self.shape, self.type_proto, self.producer, self.producer_slot,
                list(self.uses), self.graph, self.place, self.doc_string, self.metadata, self._const,
                self._source, self._output_count, self._is_input)

    def _journal_restore(self, state: tuple) -> None:
        for slot, value in zip(_STATE_SLOTS, state):
            object.__setattr__(self, slot, value)

    # --- what kind of value this is -------------------------------------------------------------------
    @property
    def is_initializer(self) -> bool:
        return self._const is not None or self._source is not None

    @property
    def is_graph_input(self) -> bool:
        return self._is_input

    @property
    def is_graph_output(self) -> bool:
        return self._output_count > 0

    @property
    def is_constant(self) -> bool:
        """An initializer the user cannot override (an initializer that is also a graph input can be fed)."""
        return self.is_initializer and not self._is_input

    @property
    def const(self) -> np.ndarray | None:
        """The initializer's data, read-only; None when this is not an initializer."""
        if self._const is None and self._source is not None:
            array = self._source.array()
            array.flags.writeable = False
            self._const = array
        return self._const

    @const.setter
    def const(self, array: np.ndarray | None) -> None:
        """Replace the data; a pass that changes a weight builds a new array and sets it here."""
        self._source = None
        if array is not None:
            array = np.asarray(array)
            array.flags.writeable = False
        self._const = array

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The initializer's elements at these flat positions (a few, for a fingerprint), read from its file
        without mapping it when it is mapped data, else from the array."""
        if self._source is not None:  # unchanged since loading (a pass that sets const drops the source)
            found = self._source.take(positions)
            if found is not None:
                return found
        return np.asarray(self.const).reshape(-1)[positions]

    def release_pages(self) -> None:
        """After reading a few elements of a mapped weight: drop the pages the read mapped, so a pass that
        samples every weight does not hold the whole model in its resident set."""
        if self._source is not None:
            self._source.release()

    @property
    def const_source(self) -> ConstSource | None:
        """The untouched lazy source of an initializer, which the writer streams without a copy."""
        return self._source

    def constant_value(self) -> np.ndarray | None:
        """Data known at optimization time: a non-input initializer or the output of a Constant node."""
        if self.is_constant:
            return self.const
        producer = self.producer
        if producer is not None and producer.op_type == "Constant" and producer.domain == "":
            return producer.constant_output()
        return None

    @property
    def nbytes(self) -> int:
        """Stored bytes of an initializer, without materializing it."""
        if self._const is not None:
            return int(self._const.nbytes)
        return self._source.nbytes if self._source is not None else 0

    # --- type ---------------------------------------------------------------------------------------
    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.dtype != 0 and self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def numel(self) -> int | None:
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return math.prod(self.shape)  # Python ints: a declared shape may overflow int64

    def copy_type_from(self, other: "Value") -> "Value":
        self.dtype, self.shape, self.type_proto = other.dtype, other.shape, other.type_proto
        return self

    # --- uses ---------------------------------------------------------------------------------------
    def consumers(self) -> list["Node"]:
        """Distinct consuming nodes, in order of first use."""
        return list(dict.fromkeys(use.node for use in self.uses))

    def has_single_consumer(self) -> bool:
        """Exactly one consuming node and no graph-output use."""
        return not self.is_graph_output and len(self.consumers()) == 1

    @property
    def is_used(self) -> bool:
        return bool(self.uses) or self.is_graph_output
