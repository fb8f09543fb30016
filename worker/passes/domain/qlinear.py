"""qlinear_fuse: an op between DequantizeLinear and QuantizeLinear becomes its quantized form, one op of the
``mirserve`` domain that a target runs as one int8 kernel (onnxruntime's QDQ selectors, Paddle-Lite's
quantized conv2d / fc / elementwise kernels).

    DQ(a_q, a_s, a_z) --+
                        +-> Add -> Q(., c_s, c_z) -> c_q  =>  mirserve.QLinearAdd(a_q, a_s, a_z, b_q, b_s, b_z, c_s, c_z)
    DQ(b_q, b_s, b_z) --+

for every op of ``worker.kernels.ops.QLINEAR_FORMS`` (Conv keeps its float bias as a last input). The
function body is exactly the DequantizeLinear / op / QuantizeLinear nodes replaced, so a runtime that inlines
it computes bit for bit what the input model computed. A DequantizeLinear that other nodes still read stays.

Preconditions: every operand of the op is the output of a DequantizeLinear of 8-bit data in the same graph;
the op's result is read only by one QuantizeLinear to 8 bits and is no graph output; scales are float32 and
per tensor, except a weight's along the axis the body writes (Conv: 0; MatMul: 1, DequantizeLinear's
default); zero points are constants or absent (made explicit here, as QLinear kernels take them); no
block quantization. Like the place passes, it plans for the target: it is emitted only when a place the user
gave has a kernel for it (on a target without one, the Q/DQ form stays, and the place passes decide).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from worker.domain import DOMAIN
from worker.ir import Graph, Node, Value
from worker.kernels.ops import QLINEAR_FORMS, QLinearForm
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.domain.activation_fuse import conv_attributes
from worker.passes.domain.ops import QLINEAR_WEIGHT_AXIS
from worker.passes.domain.support import drop_unused_constants, emit_refusal, live_graphs
from worker.passes.place.qdq import in_quantized_region
from worker.passes.registry import register_pass

EIGHT_BIT = (TensorProto.UINT8, TensorProto.INT8)
#: The DequantizeLinear / QuantizeLinear attributes the body reproduces (others are refused).
_KNOWN = {"axis"}


class _Refusal(Exception):
    """Why one node keeps its Q/DQ form: a sentence without node names, so that the trace counts alike ones."""


def _producer_dq(value: Value | None, graph: Graph) -> Node:
    producer = value.producer if value is not None else None
    if producer is None or producer.op_type != "DequantizeLinear" or producer.domain != "":
        raise _Refusal("an operand is not the output of a DequantizeLinear")
    if producer.graph is not graph:
        raise _Refusal("an operand is dequantized in an enclosing graph")
    data = producer.input(0)
    if data.dtype not in EIGHT_BIT:
        raise _Refusal(f"an operand is dequantized from {_type(data.dtype)} data, not from 8 bits")
    return producer


def _the_quantize(node: Node) -> Node:
    out = node.output(0)
    if out.is_graph_output:
        raise _Refusal("its float result is a graph output")
    if len(out.uses) != 1 or out.uses[0].slot != 0:
        raise _Refusal(f"its float result is read by {len(out.uses)} nodes, not by one QuantizeLinear")
    quant = out.uses[0].node
    if quant.op_type != "QuantizeLinear" or quant.domain != "":
        raise _Refusal(f"its result is read by a {quant.op_type}, not by a QuantizeLinear")
    if quant.output(0).dtype not in EIGHT_BIT:
        raise _Refusal(f"its result is quantized to {_type(quant.output(0).dtype)}, not to 8 bits")
    return quant


def _check_params(qnode: Node, axis: int | None) -> None:
    """Float32 scale and zero point known offline, per tensor unless along ``axis``, no other attributes."""
    what = qnode.op_type
    unknown = sorted(set(qnode.attributes) - _KNOWN)
    if unknown:
        raise _Refusal(f"a {what} sets {', '.join(unknown)}, which the quantized form does not carry")
    scale, zero = qnode.input(1), qnode.input(2)
    if scale.dtype != TensorProto.FLOAT:
        raise _Refusal(f"a {what} scale is {_type(scale.dtype)}; QLinear kernels take float32")
    values = scale.constant_value()
    if values is None or (zero is not None and zero.constant_value() is None):
        raise _Refusal(f"a {what} scale or zero point is not known offline")
    if values.size == 1:
        return
    if axis is None:
        raise _Refusal(f"a {what} is per axis where the quantized form takes a per-tensor scale")
    if int(qnode.attr("axis", 1)) != axis:
        raise _Refusal(f"a {what} is along axis {qnode.attr('axis', 1)}, the quantized form's along {axis}")


def _weight_axis(form: QLinearForm, slot: int, node: Node, opset: int) -> int | None:
    if slot != 1 or opset < 13 or form.op not in QLINEAR_WEIGHT_AXIS:
        return None
    axis = QLINEAR_WEIGHT_AXIS[form.op]
    if form.op == "MatMul" and node.input(1).rank != 2:
        return None  # axis 1 is the output column only for a 2-D weight
    return axis


def _type(dtype: int) -> str:
    return helper.tensor_dtype_to_string(dtype).replace("TensorProto.", "").lower() if dtype else "unknown"


class _Zeros:
    """One explicit zero-point initializer per element type and graph, shared by every fused node."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, int], Value] = {}

    def of(self, graph: Graph, dtype: int) -> Value:
        key = (id(graph), dtype)
        if key not in self._made:
            array = np.zeros((), helper.tensor_dtype_to_np_dtype(dtype))
            self._made[key] = graph.add_initializer(f"qlinear_zero_{_type(dtype)}", array)
        return self._made[key]


def _plan(ctx: PassContext, graph: Graph, node: Node, form: QLinearForm, opset: int):
    """(dequantize nodes, quantize node, attributes) for fusing ``node``; raises _Refusal."""
    operands = len(form.operands)
    extra = len(node.inputs) - operands
    if extra > (1 if form.bias else 0) or len(node.outputs) != 1:
        raise _Refusal(f"it has {len(node.inputs)} inputs and {len(node.outputs)} outputs, the quantized form "
                       f"{operands}{' + bias' if form.bias else ''} and 1")
    dqs = [_producer_dq(node.input(slot), graph) for slot in range(operands)]
    quant = _the_quantize(node)
    for slot, dq in enumerate(dqs):
        _check_params(dq, _weight_axis(form, slot, node, opset))
    _check_params(quant, None)
    attributes: dict = {}
    if form.op == "Conv":
        attributes = conv_attributes(node, transpose=False)
        if isinstance(attributes, str):
            raise _Refusal(attributes)
    elif form.op == "Softmax":
        _check_last_axis(node, opset)
    elif node.attributes:
        raise _Refusal(f"it has attribute(s) {', '.join(sorted(node.attributes))}, which the quantized form "
                       f"does not carry")
    reason = emit_refusal(ctx, form.name, node.output(0).dtype) or _user_kernel_refusal(ctx, form)
    if reason:
        raise _Refusal(reason)
    return dqs, quant, attributes


def _check_last_axis(node: Node, opset: int) -> None:
    rank = node.input(0).rank
    axis = int(node.attr("axis", -1 if opset >= 13 else 1))
    if rank is None or axis % max(rank, 1) != rank - 1:
        raise _Refusal("it is a softmax over another axis than the last; QLinearSoftmax is over the last")


def _user_kernel_refusal(ctx: PassContext, form: QLinearForm) -> str | None:
    """Only a kernel on a target the user named makes the quantized form worth it (not the host fallback)."""
    if ctx.kernels is None:
        return None
    user = {p.target.name for p in ctx.places.places[:ctx.places.user_count]}
    if ctx.kernels.has_kernel(form.name, DOMAIN, user):
        return None
    return (f"no place given ({', '.join(sorted(user))}) has a {DOMAIN}.{form.name} kernel: the Q/DQ form "
            f"stays for the place passes")


def _rewrite(graph: Graph, node: Node, form: QLinearForm, dqs: list[Node], quant: Node, attributes: dict,
             zeros: _Zeros, result: PassResult) -> None:
    def zero_point(qnode: Node, of: Value) -> Value:
        return qnode.input(2) if qnode.input(2) is not None else zeros.of(graph, of.dtype)

    inputs: list[Value | None] = []
    for dq in dqs:
        inputs += [dq.input(0), dq.input(1), zero_point(dq, dq.input(0))]
    out = quant.output(0)
    inputs += [quant.input(1), zero_point(quant, out)]
    if form.bias:  # passed even when absent (as ""): onnx.reference wants a function's inputs complete
        inputs.append(node.input(len(dqs)))
    fused = graph.add_node(form.name, inputs, [out], domain=DOMAIN, attributes=attributes,
                           name=f"{node.name}_qlinear", before=node)
    replaced = [node.name, quant.name]
    graph.remove_nodes([node, quant])
    constants = []
    for dq in dict.fromkeys(dqs):  # a DequantizeLinear other nodes still read stays
        if dq.graph is graph and not dq.output(0).uses and not dq.output(0).is_graph_output:
            replaced.insert(0, dq.name)
            constants += [v for v in dq.inputs if v is not None]
            graph.remove_node(dq)
    drop_unused_constants(constants)
    result.rewrote({"rule": form.name, "from": replaced, "to": [fused.name]})


@register_pass(name="qlinear_fuse", kind=PassKind.PROGRAM, level=2, portable=False,
               description="DequantizeLinear -> Conv / MatMul / Add / Mul / GlobalAveragePool / Sigmoid / "
                           "Softmax -> QuantizeLinear -> mirserve.QLinear<Op> (one int8 kernel)")
def qlinear_fuse(ctx: PassContext) -> PassResult:
    result = PassResult()
    opset = ctx.opset("")
    zeros = _Zeros()
    for graph in live_graphs(ctx):
        found = [n for op in QLINEAR_FORMS for n in graph.nodes_of_type(op)]
        for node in sorted(found, key=lambda n: n.position):
            if node.graph is not graph or node.domain != "":
                continue
            form = QLINEAR_FORMS[node.op_type]
            try:
                dqs, quant, attributes = _plan(ctx, graph, node, form, opset)
            except _Refusal as refusal:
                if in_quantized_region(node):  # a float op outside quantized data is not a refusal
                    result.refused(f"{form.name}: {refusal}")
                continue
            _rewrite(graph, node, form, dqs, quant, attributes, zeros, result)
    return result

