"""What the place passes read off the IR: node facts for kernel pick, attribute defaults, fetch contracts.

The feed/fetch contract: graph inputs arrive on the host in their own dtype and NCHW, and graph outputs
must leave the same way. ``variable_place_inference`` records each output's contract before it changes a
value's dtype; the cast passes read it back. It lives beside the graph (weakly keyed by the graph, then by
output name, which casts at an output keep) because it is not part of the written model.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, replace
from typing import Any, Mapping

from onnx import defs

from worker import domain
from worker.ir import Graph, Node, Value
from worker.kernels import Kernel
from worker.kernels.pick import NodeFacts, Resolved, ValueFacts
from worker.places import HOST, Layout, Place, Precision, get_target, precision_of_dtype

@dataclass
class Pick:
    """What static_kernel_pick leaves on a node (``node.kernel``): the chosen kernel, resolved."""

    resolved: Resolved
    #: The node runs in its quantized form (QLinearConv for a Conv between DequantizeLinear and
    #: QuantizeLinear): type_precision_cast absorbs the Q/DQ pair.
    qdq: Any = None

    @property
    def kernel(self) -> Kernel:
        return self.resolved.kernel

    @property
    def place(self) -> Place:
        return Place(get_target(self.kernel.target), self.resolved.precision, self.resolved.layout)


_FETCH: "weakref.WeakKeyDictionary[Graph, dict[str, Place]]" = weakref.WeakKeyDictionary()


def host_place(dtype: int) -> Place:
    return Place(HOST, precision_of_dtype(dtype), Layout.NCHW)


def set_fetch(graph: Graph, value: Value, place: Place) -> None:
    _FETCH.setdefault(graph, {}).setdefault(value.name, place)


def fetch_place(graph: Graph, value: Value) -> Place:
    """The place a graph output must leave in: recorded, or host / its dtype / nchw."""
    return _FETCH.get(graph, {}).get(value.name) or host_place(value.dtype)


def is_constant(value: Value) -> bool:
    """Known offline: an initializer the user cannot feed, or a Constant node's output."""
    if value.is_constant:
        return True
    producer = value.producer
    return producer is not None and producer.op_type == "Constant" and producer.domain == ""


def value_facts(value: Value, current: Mapping[Value, tuple[Precision, Layout]] | None = None) -> ValueFacts:
    if current is not None and value in current:
        precision, layout = current[value]
    elif value.place is not None:
        precision, layout = value.place.precision, value.place.layout
    else:
        precision, layout = precision_of_dtype(value.dtype), Layout.NCHW
    dtype = value.dtype
    if dtype in (1, 10) and precision in (Precision.FP32, Precision.FP16):  # as a producer's kernel makes it
        dtype = 1 if precision is Precision.FP32 else 10
    return ValueFacts(dtype=dtype, rank=value.rank, shape=value.shape, is_constant=is_constant(value),
                      precision=precision, layout=layout, is_tensor=value.type_proto is None,
                      numel=value.numel())


def node_facts(node: Node, opset: int, current: Mapping[Value, tuple[Precision, Layout]] | None = None
               ) -> NodeFacts:
    inputs = tuple(None if v is None else value_facts(v, current) for v in node.inputs)
    outputs = tuple(replace(value_facts(v, current), used=v.is_used) for v in node.outputs)
    attributes = dict(attribute_defaults(node.op_type, node.domain, opset))
    attributes.update({name: attr.value for name, attr in node.attributes.items()})
    return NodeFacts(node.op_type, node.domain, opset, inputs, outputs, attributes, node.name)


@functools.lru_cache(maxsize=None)
def attribute_defaults(op: str, op_domain: str, opset: int) -> Mapping[str, Any]:
    """Default values of an op's attributes at an opset (schema defaults; own-domain op defaults)."""
    if op_domain == domain.DOMAIN:
        own = domain.get_op(op)
        return {} if own is None else {k: v for k, v in own.attributes.items() if v is not None}
    try:
        schema = defs.get_schema(op, opset, op_domain)
    except Exception:  # an op onnx does not know (a custom domain): no defaults
        return {}
    found = {}
    for name, attr in schema.attributes.items():
        if attr.default_value is not None and attr.default_value.type:
            from onnx import helper
            value = helper.get_attribute_value(attr.default_value)
            found[name] = value.decode() if isinstance(value, bytes) else value
    return found


def node_opset(model_opsets, node: Node) -> int:
    """The opset version a node is read at: its domain's import (own-domain ops are version 1)."""
    if node.domain == domain.DOMAIN:
        return domain.VERSION
    return model_opsets(node.domain)
