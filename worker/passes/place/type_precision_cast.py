"""type_precision_cast: a calib wherever a value's precision differs from what its consumer declares.

    y (fp32) -> Conv (arm fp16)            ->  y -> mirserve.calib(to=float16) -> Conv
    w (fp32 weight) -> Conv (arm fp16)     ->  w16 (a float16 initializer) -> Conv      (folded offline)
    DQ -> Conv -> Q  (Conv on int8)        ->  QLinearConv                             (Q/DQ absorbed)
    y (fp16) -> graph output               ->  y -> calib(to=float) -> output, under the output's name

Calibs convert between fp32 and fp16 only; int8 comes only from the model's own quantization parameters
(QuantizeLinear / DequantizeLinear), whose pairs around an int8 kernel are absorbed into it. One calib per
(value, precision), shared by all consumers; one converted copy per (weight, precision).
"""
from __future__ import annotations

from onnx import TensorProto

from worker.errors import PassError
from worker.ir import Graph, Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.place import qdq
from worker.passes.place.casts import (annotate, cast_kernel, consumer_slots, converted_constant, declared,
                                       drop_if_unused, find_shared, insert_cast, np_dtype, redirect_output,
                                       to_fp16)
from worker.passes.place.facts import Pick, fetch_place, is_constant
from worker.passes.place.variable_place_inference import place_outputs
from worker.passes.registry import register_pass
from worker.places import Layout, Place, Precision, get_target, precision_of_dtype

FLOATS = (Precision.FP32, Precision.FP16)
_DTYPES = {Precision.FP32: TensorProto.FLOAT, Precision.FP16: TensorProto.FLOAT16}


def calibrated(graph: Graph, value: Value, precision: Precision, target: str, before: Node | None,
               portable: bool, cache: dict) -> Value:
    """``value`` in ``precision``: a converted constant, or a shared calib on ``target``."""
    source = value.place.precision
    place = Place(get_target(target), precision, value.place.layout)
    dtype = _DTYPES[precision]
    if is_constant(value):
        convert = to_fp16 if precision is Precision.FP16 else (lambda a: a.astype(np_dtype(dtype)))
        return converted_constant(graph, value, place, convert, precision.value, cache)
    attributes = {"to": dtype}
    shared = find_shared(value, "calib", attributes, place)
    if shared is not None:
        return shared
    kernel = cast_kernel("calib", target, f"{source.value}_to_{precision.value}")
    return insert_cast(graph, value, "calib", attributes, place, kernel, before=before, dtype=dtype,
                       shape=value.shape, portable=portable)


def absorb_quantized(graph: Graph) -> int:
    absorbed = 0
    for node in list(graph):
        pick = node.kernel
        if node.graph is not graph or not isinstance(pick, Pick) or pick.qdq is None:
            continue
        qnode = qdq.absorb(graph, pick.qdq)
        new_pick = Pick(pick.resolved)
        annotate(qnode, pick.kernel, pick.place, new_pick)
        place_outputs(qnode, new_pick)
        for value in qnode.inputs:
            if value is not None and value.place is None:  # zero points and bias made here
                value.place = Place(pick.place.target, precision_of_dtype(value.dtype), Layout.NCHW)
        absorbed += 1
    return absorbed


@register_pass(name="type_precision_cast", kind=PassKind.PROGRAM, level=1,
               description="insert calib (fp32 <-> fp16) where precisions differ, convert weights offline, "
                           "absorb Q/DQ pairs around int8 kernels")
def type_precision_cast(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph, portable, cache = ctx.graph, ctx.options.portable, {}
    result.data["quantized_nodes"] = absorb_quantized(graph)
    result.rewrites += result.data["quantized_nodes"]
    for node, slot, value in consumer_slots(graph):
        wanted, _, target = declared(node, slot)
        current = value.place.precision if value.place is not None else None
        if current is None or Precision.ANY in (wanted, current) or wanted is current:
            continue
        if wanted not in FLOATS or current not in FLOATS:
            raise PassError(f"type_precision_cast: node {node.name} ({node.op_type}) declares {wanted} at "
                            f"input {slot}, but {value.name} is {current}; only fp32 <-> fp16 converts")
        node.set_input(slot, calibrated(graph, value, wanted, target, node, portable, cache))
        drop_if_unused(graph, value)
        result.rewrote({"value": value.name, "to": wanted.value, "consumer": node.name})
    for value in list(graph.outputs):
        fetch = fetch_place(graph, value)
        if value.place is None or value.place.precision is fetch.precision or fetch.precision not in FLOATS:
            continue
        converted = calibrated(graph, value, fetch.precision, value.place.target.name, None, portable, cache)
        redirect_output(graph, value, converted)
        result.rewrote({"value": value.name, "to": fetch.precision.value, "consumer": "graph output"})
    return result
