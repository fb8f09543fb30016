"""type_precision_cast: a calib wherever a value's precision differs from what its consumer declares.

    y (fp32) -> Conv (arm fp16)            ->  y -> mirserve.calib(to=float16) -> Conv
    w (fp32 weight) -> Conv (arm fp16)     ->  w16 (a float16 initializer) -> Conv      (folded offline)
    DQ -> Conv -> Q  (Conv on int8)        ->  QLinearConv                             (Q/DQ absorbed)
    y (fp16) -> graph output               ->  y -> calib(to=float) -> output, under the output's name
    y (fp16 computed in fp32) -> Cast      ->  y -> calib(to=float16) [-> calib(to=float)] -> Cast

Calibs convert between fp32 and fp16 only; int8 comes only from the model's own quantization parameters
(QuantizeLinear / DequantizeLinear), whose pairs around an int8 kernel are absorbed into it. One calib per
(value, precision), shared by all consumers; one converted copy per (weight, precision). A value an If, Loop
or Scan body reads from outside gets its calib before that node (bodies run in their own types).

A value the model declares fp16 that an fp32 kernel computes (``PassContext.widened``) holds more than fp16
does; that is harmless while its consumers' results stay widened too (an fp16 graph output gets its calib
back), but a consumer whose result leaves the fp16 value's type (a Cast to float or int, a comparison,
ArgMax) would compute from digits the model never had: it reads the value rounded to fp16 (and back to fp32
where its kernel declares fp32, a round trip type_cast_cleanup keeps). Shape and Size read no values.
"""
from __future__ import annotations

from onnx import TensorProto

from worker.engine.errors import PassError
from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels.pick import Pick
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support import qdq
from worker.engine.passes.support.casts import (captured_reads, cast_kernel, cast_kind, consumer_slots, converted_constant,
                                                find_shared,
                                                insert_cast, np_dtype, redirect_output, to_fp16)
from worker.engine.passes.support.placement import annotate, fetch_place, is_constant, place_outputs
from worker.engine.places import Layout, Place, Precision, get_target, precision_of_dtype

FLOATS = (Precision.FP32, Precision.FP16)
_DTYPES = {Precision.FP32: TensorProto.FLOAT, Precision.FP16: TensorProto.FLOAT16}


def calibrated(ctx: PassContext, value: Value, precision: Precision, target: str, before: Node | None,
               cache: dict) -> Value:
    """``value`` in ``precision``: a converted constant, or a shared calib on ``target``."""
    graph = ctx.graph
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
    kernel = cast_kernel(ctx.kernels, "calib", target, f"{source.value}_to_{precision.value}")
    return insert_cast(graph, value, "calib", attributes, place, kernel, before=before, dtype=dtype,
                       shape=value.shape, portable=ctx.options.portable)


#: Ops that read only their input's shape, never its values.
_SHAPE_READERS = frozenset({"Shape", "Size"})


def _source(value: Value) -> Value:
    """The value ``value`` copies: io_copy and layout casts change where it lives, not its numbers."""
    while value.producer is not None and cast_kind(value.producer) in ("io_copy", "layout"):
        value = value.producer.input(0)
    return value


def ends_widening(ctx: PassContext, node: Node, value: Value) -> bool:
    """``value`` is an fp16 value computed in fp32 and ``node`` makes from it a result that is not widened:
    the model's fp16 rounding would be lost in it."""
    if not ctx.widened or value.place is None or value.place.precision is not Precision.FP32:
        return False
    if node.domain == "" and node.op_type in _SHAPE_READERS:
        return False
    if _source(value).name not in ctx.widened:
        return False
    return not any(out.name in ctx.widened for out in node.outputs if out is not None)


def absorb_quantized(graph: Graph) -> int:
    absorbed = 0
    for node in list(graph):
        pick = node.pick
        if node.graph is not graph or pick is None or pick.qdq is None:
            continue
        qnode = qdq.absorb(graph, pick.qdq)
        new_pick = Pick(pick.resolved, absorbed=True)
        annotate(qnode, new_pick)
        place_outputs(qnode, new_pick)
        for value in qnode.inputs:
            if value is not None and value.place is None:  # zero points and bias made here
                value.place = Place(pick.place.target, precision_of_dtype(value.dtype), Layout.NCHW)
        absorbed += 1
    return absorbed


@register_pass(name="type_precision_cast", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="insert calib (fp32 <-> fp16) where precisions differ, convert weights offline, "
                           "absorb Q/DQ pairs around int8 kernels")
def type_precision_cast(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph, cache = ctx.graph, {}
    result.data["quantized_nodes"] = absorb_quantized(graph)
    result.rewrites += result.data["quantized_nodes"]
    for node, slot, value in consumer_slots(graph):
        port = node.pick.input(slot)
        wanted, target = port.precision, port.target
        if ends_widening(ctx, node, value) and wanted is not Precision.FP16:
            rounded = calibrated(ctx, value, Precision.FP16, target, node, cache)
            if wanted is Precision.FP32:
                rounded = calibrated(ctx, rounded, Precision.FP32, target, node, cache)
            node.set_input(slot, rounded)
            graph.remove_unused([value])
            result.rewrote({"value": value.name, "to": "fp16 (rounded)", "consumer": node.name})
            continue
        current = value.place.precision if value.place is not None else None
        if current is None or Precision.ANY in (wanted, current) or wanted is current:
            continue
        if wanted not in FLOATS or current not in FLOATS:
            raise PassError(f"type_precision_cast: node {node.name} ({node.op_type}) declares {wanted} at "
                            f"input {slot}, but {value.name} is {current}; only fp32 <-> fp16 converts")
        node.set_input(slot, calibrated(ctx, value, wanted, target, node, cache))
        graph.remove_unused([value])
        result.rewrote({"value": value.name, "to": wanted.value, "consumer": node.name})
    for node, inner, slot, value in captured_reads(graph):
        wanted, current = inner.pick.input(slot).precision, value.place.precision
        if wanted in FLOATS and current in FLOATS and wanted is not current and not is_constant(value):
            inner.set_input(slot, calibrated(ctx, value, wanted, node.pick.kernel.target, node, cache))
            result.rewrote({"value": value.name, "to": wanted.value, "consumer": inner.name})
    for value in list(graph.outputs):
        fetch = fetch_place(ctx, value)
        if value.place is None or value.place.precision is fetch.precision or fetch.precision not in FLOATS:
            continue
        converted = calibrated(ctx, value, fetch.precision, value.place.target.name, None, cache)
        redirect_output(graph, value, converted)
        result.rewrote({"value": value.name, "to": fetch.precision.value, "consumer": "graph output"})
    return result
