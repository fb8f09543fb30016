"""qlinear_fuse: an op between DequantizeLinear and QuantizeLinear becomes its quantized form, one op of the
``mirserve`` domain that a target runs as one int8 kernel (onnxruntime's QDQ selectors, Paddle-Lite's
quantized conv2d / fc / elementwise kernels).

    DQ(a_q, a_s, a_z) --+
                        +-> Add -> Q(., c_s, c_z) -> c_q  =>  mirserve.QLinearAdd(a_q, a_s, a_z, b_q, b_s, b_z, c_s, c_z)
    DQ(b_q, b_s, b_z) --+

for every op of ``worker.engine.kernels.ops.QLINEAR_FORMS`` (Conv keeps its float bias as a last input). The
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

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from worker.engine.mirserve_domain.ops import DOMAIN
from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels.ops import QLINEAR_FORMS, QLinearForm
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.activation_fusion import conv_attributes
from worker.engine.mirserve_domain.fused import QLINEAR_WEIGHT_AXIS
from worker.engine.passes.support.mirserve_ops import emit_refusal
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

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


def _check_quantized_to_8_bits(quant: Node) -> None:
    if quant.output(0).dtype not in EIGHT_BIT:
        raise _Refusal(f"its result is quantized to {_type(quant.output(0).dtype)}, not to 8 bits")


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


@dataclass(frozen=True)
class QLinearPlan:
    dequantizers: list[Node]
    attributes: dict


def _plan(ctx: PassContext, match: Match, form: QLinearForm, opset: int) -> QLinearPlan:
    """The DequantizeLinear of each operand and the attributes of the fused op; raises _Refusal."""
    node, quant, graph = match.node("op"), match.node("quant"), match.graph
    operands = len(form.operands)
    extra = len(node.inputs) - operands
    if extra > (1 if form.bias else 0) or len(node.outputs) != 1:
        raise _Refusal(f"it has {len(node.inputs)} inputs and {len(node.outputs)} outputs, the quantized form "
                       f"{operands}{' + bias' if form.bias else ''} and 1")
    dqs = [_producer_dq(node.input(slot), graph) for slot in range(operands)]
    _check_quantized_to_8_bits(quant)
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
    return QLinearPlan(dqs, attributes)


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


class QLinearFusion(Rule):
    """DequantizeLinear of each operand -> ``form.op`` -> QuantizeLinear becomes ``form.name``."""

    pattern_args = ("form",)

    def __init__(self, form: QLinearForm, zeros: _Zeros):
        super().__init__()
        self.form, self.zeros, self.name = form, zeros, form.name

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        operands = [p.var(f"operand{slot}") for slot in range(len(self.form.operands))]
        p.QuantizeLinear(p.op(self.form.op, *operands, key="op", out="c"), key="quant", out="y_q")
        return p

    def check(self, ctx: PassContext, match: Match) -> QLinearPlan | str:
        try:
            return _plan(ctx, match, self.form, ctx.opset(""))
        except _Refusal as refusal:
            return str(refusal)

    def rewrite(self, ctx: PassContext, match: Match, plan: QLinearPlan) -> Node:
        node, quant, graph = match.node("op"), match.node("quant"), match.graph

        def zero_point(qnode: Node, of: Value) -> Value:
            return qnode.input(2) if qnode.input(2) is not None else self.zeros.of(graph, of.dtype)

        inputs: list[Value | None] = []
        for dq in plan.dequantizers:  # each goes once nothing else reads it
            inputs += [dq.input(0), dq.input(1), zero_point(dq, dq.input(0))]
        inputs += [quant.input(1), zero_point(quant, match.value("y_q"))]
        if self.form.bias:  # passed even when absent (as ""): onnx.reference wants a function's inputs complete
            inputs.append(node.input(len(plan.dequantizers)))
        return graph.add_node(self.form.name, inputs, [match.value("y_q")], domain=DOMAIN,
                              attributes=plan.attributes, name=f"{node.name}_qlinear", before=node)


@register_pass(name="qlinear_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=2, portable=False,
               description="DequantizeLinear -> Conv / MatMul / Add / Mul / GlobalAveragePool / Sigmoid / "
                           "Softmax -> QuantizeLinear -> mirserve.QLinear<Op> (one int8 kernel)")
def qlinear_fuse(ctx: PassContext) -> PassResult:
    zeros = _Zeros()
    return apply_rules(ctx, [QLinearFusion(form, zeros) for form in QLINEAR_FORMS.values()])
