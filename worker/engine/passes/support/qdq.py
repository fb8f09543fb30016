"""Quantized forms: a Conv or MatMul between DequantizeLinear and QuantizeLinear can run on an int8 kernel.

    DQ(x_q) --+                                   x_q --+
    DQ(w_q) --+-> Conv -> Q -> y_q      ==>       w_q --+-> QLinearConv -> y_q
    [DQ(b)] --+                          (scales and zero points as inputs, bias re-quantized to int32)

The model carries the quantization parameters; nothing is calibrated here. Kernel pick scores the int8
candidates (QLinearConv / QLinearMatMul kernels) against the float ones; when an int8 kernel wins,
type_precision_cast absorbs the Q/DQ pair into it. Preconditions: per-tensor activation scales and zero
points known offline, constant int8 weights (per-tensor, or per output channel for Conv), a float bias known
offline, and a float result read only by one QuantizeLinear.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels.pick import NodeFacts, ValueFacts
from worker.engine.passes.support.operands import per_tensor_params
from worker.engine.passes.support.placement import is_constant, value_facts

QLINEAR = {"Conv": "QLinearConv", "MatMul": "QLinearMatMul"}
INT8_DTYPES = (2, 3)  # uint8, int8

#: What the quantized node made of a Q/DQ sandwich adds to the name of the node it replaces.
QUANTIZED_SUFFIX = "_int8"


@dataclass
class Sandwich:
    node: Node
    data: Node          # DequantizeLinear of the activation
    weight: Node        # DequantizeLinear of the constant weight
    quant: Node         # the QuantizeLinear reading the result
    bias: Value | None  # Conv's float bias (a constant, or a DequantizeLinear of one)

    @property
    def qop(self) -> str:
        return QLINEAR[self.node.op_type]


def _dq(value: Value | None) -> Node | None:
    producer = value.producer if value is not None else None
    if producer is None or producer.op_type != "DequantizeLinear" or producer.domain != "":
        return None
    if producer.input(0) is None or producer.input(0).dtype not in INT8_DTYPES:
        return None
    return producer


def quantized_weight(value: Value) -> np.ndarray | None:
    """An int8 weight known offline: a constant, or QuantizeLinear of constants (computed here)."""
    direct = _const(value)
    if direct is not None:
        return direct
    quant = value.producer
    if quant is None or quant.op_type != "QuantizeLinear" or quant.domain != "":
        return None
    data, scale = _const(quant.input(0)), _const(quant.input(1))
    zero = _const(quant.input(2)) if quant.input(2) is not None else np.zeros((), np.uint8)
    if data is None or scale is None or zero is None:
        return None
    if scale.size != 1:
        shape = [1] * data.ndim
        shape[quant.attr("axis", 1)] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    info = np.iinfo(zero.dtype)
    quantized = np.round(data.astype(np.float64) / scale) + zero.astype(np.float64)
    return np.clip(quantized, info.min, info.max).astype(zero.dtype)


def in_quantized_region(node: Node) -> bool:
    """The node reads a DequantizeLinear output or feeds a QuantizeLinear: it computes quantized data."""
    for value in node.inputs:
        producer = value.producer if value is not None else None
        if producer is not None and producer.op_type == "DequantizeLinear" and producer.domain == "":
            return True
    return any(use.node.op_type == "QuantizeLinear" and use.node.domain == ""
               for value in node.outputs for use in value.uses)


def _const(value: Value | None) -> np.ndarray | None:
    if value is None or not is_constant(value):
        return None
    return value.constant_value()


def find(node: Node) -> Sandwich | None:
    """The Q/DQ sandwich around ``node``, or None when the node cannot run in its quantized form."""
    if node.domain != "" or node.op_type not in QLINEAR:
        return None
    data, weight = _dq(node.input(0)), _dq(node.input(1))
    out = node.output()
    if data is None or weight is None or out.is_graph_output or len(out.uses) != 1:
        return None
    quant = out.uses[0].node
    if quant.op_type != "QuantizeLinear" or quant.domain != "" or out.uses[0].slot != 0:
        return None
    if per_tensor_params(data) is None or per_tensor_params(quant) is None \
            or quantized_weight(weight.input(0)) is None:
        return None
    w_scale = _const(weight.input(1))
    if w_scale is None or (w_scale.size != 1 and (node.op_type != "Conv" or weight.attr("axis", 1) != 0)):
        return None
    bias = node.input(2) if node.op_type == "Conv" else None
    if bias is not None and _bias_array(bias) is None:
        return None
    return Sandwich(node, data, weight, quant, bias)


def _bias_array(bias: Value) -> np.ndarray | None:
    direct = _const(bias)
    if direct is not None:
        return direct.astype(np.float64)
    dq = bias.producer
    if dq is None or dq.op_type != "DequantizeLinear" or _const(dq.input(0)) is None:
        return None
    scale, zero = _const(dq.input(1)), _const(dq.input(2)) if dq.input(2) is not None else 0
    if scale is None or zero is None:
        return None
    return (_const(dq.input(0)).astype(np.float64) - np.asarray(zero, np.float64)) * scale


def _zero(node: Node, graph: Graph, dtype_of: Value) -> Value:
    """A node's zero point input, made explicit (QLinear ops require it)."""
    if node.input(2) is not None:
        return node.input(2)
    from onnx import helper
    return graph.add_initializer(f"{dtype_of.name}_zero_point",
                                 np.zeros((), helper.tensor_dtype_to_np_dtype(dtype_of.dtype)))


def facts(sandwich: Sandwich, opset: int) -> NodeFacts:
    """The node as its quantized form would be: inputs in QLinearConv / QLinearMatMul order."""
    data, weight, quant = sandwich.data, sandwich.weight, sandwich.quant

    def of(value: Value | None, dtype: int | None = None) -> ValueFacts:
        if value is None:  # an implicit zero point: a constant of the data's type
            return ValueFacts(dtype=dtype or 2, rank=0, is_constant=True, numel=1)
        return value_facts(value)

    x, w, y = data.input(0), weight.input(0), quant.output()
    weight_facts = replace(of(w), is_constant=True)  # known offline (find checked)
    inputs = [of(x), of(data.input(1)), of(data.input(2), x.dtype), weight_facts, of(weight.input(1)),
              of(weight.input(2), w.dtype), of(quant.input(1)), of(quant.input(2), y.dtype)]
    if sandwich.qop == "QLinearConv" and sandwich.bias is not None:
        inputs.append(ValueFacts(dtype=6, rank=1, is_constant=True))
    attributes = {name: attr.value for name, attr in sandwich.node.attributes.items()}
    outputs = (value_facts(y),)
    return NodeFacts(sandwich.qop, "", opset, tuple(inputs), outputs, attributes, sandwich.node.name)


def absorb(graph: Graph, sandwich: Sandwich) -> Node:
    """Replace DQ -> op -> Q by the quantized op producing the Q's output; dead Q/DQ nodes go."""
    data, weight, quant, node = sandwich.data, sandwich.weight, sandwich.quant, sandwich.node
    x, w = data.input(0), weight.input(0)
    if not is_constant(w):  # QuantizeLinear of a float weight: quantized here, offline
        w = graph.add_initializer(f"{w.name}_int8", quantized_weight(w))
    inputs = [x, data.input(1), _zero(data, graph, x), w, weight.input(1), _zero(weight, graph, w),
              quant.input(1), _zero(quant, graph, quant.output())]
    if sandwich.qop == "QLinearConv" and sandwich.bias is not None:
        scale = (np.asarray(data.input(1).constant_value(), np.float64)
                 * np.asarray(weight.input(1).constant_value(), np.float64))
        bias = np.round(_bias_array(sandwich.bias) / scale).astype(np.int32)
        inputs.append(graph.add_initializer(f"{node.name}_bias_int32", bias.reshape(-1)))
    attributes = {name: attr for name, attr in node.attributes.items()}
    qnode = graph.add_node(sandwich.qop, inputs, [quant.output()], name=node.name + QUANTIZED_SUFFIX,
                           attributes=attributes, before=quant)
    dead = [quant, node]
    for producer in (data, weight, weight.input(0).producer,
                     sandwich.bias.producer if sandwich.bias is not None else None):
        if producer is not None and producer not in dead:
            dead.append(producer)
    graph.remove_unused(dead)
    return qnode
