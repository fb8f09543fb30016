"""variable_place_inference: every value gets a place (target, precision, layout).

    x (graph input)     -> host / its dtype / nchw          (the feed contract)
    y = Conv(x, w)      -> the picked kernel's declared output, e.g. arm / fp16 / nhwc: dtype float16,
                           shape [N, H, W, C]
    w (a constant)      -> its first consumer's target, its own dtype, nchw: the cast passes convert it
                           offline to what each consumer declares (fp16 weights stored as fp16, NHWC
                           weights transposed in the file); it is never copied at run time
    graph outputs       -> must leave as host / their dtype / nchw (the fetch contract, recorded here)

A value of rank other than 4 has no layout of its own and is kept as nchw. Outputs a kernel declares with
precision ``any`` keep the element type type inference gave them. Values the model declares fp16 that an fp32
kernel computes are recorded (``PassContext.widened``): type_precision_cast rounds them where their widening ends.
"""
from __future__ import annotations

from onnx import TensorProto

from worker.engine.ir import Graph, Value
from worker.engine.kernels.ops import NHWC_PREFIX
from worker.engine.mirserve_domain import ops as domain
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.placement import host_place, is_constant, place_outputs, set_fetch
from worker.engine.places import Layout, Place, get_target, precision_of_dtype


def place_constant(value: Value) -> None:
    """A weight lives where its first consumer runs; its data is NCHW, unless that consumer is an NHWC
    form mirserve wrote earlier (a model optimized again), whose weights are stored NHWC already."""
    consumer = next((u for u in value.uses if u.node.pick is not None), None)
    if consumer is None:
        value.place = Place(host_place(0).target, precision_of_dtype(value.dtype), Layout.NCHW)
        return
    port = consumer.node.pick.input(consumer.slot)
    native = consumer.node.domain == domain.DOMAIN and consumer.node.op_type.startswith(NHWC_PREFIX)
    layout = Layout.NHWC if native and port.layout is Layout.NHWC and value.rank == 4 else Layout.NCHW
    value.place = Place(get_target(port.target), precision_of_dtype(value.dtype), layout)


@register_pass(name="variable_place_inference", peer="Paddle-Lite", kind=PassKind.STMT, level=1,
               description="give every value a place: graph inputs and outputs on the host (own dtype, "
                           "nchw), node outputs as their kernel declares, weights as their consumer reads")
def variable_place_inference(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph: Graph = ctx.graph
    for value in graph.outputs:
        set_fetch(ctx, value, host_place(value.dtype))
    for value in graph.inputs:
        if not value.is_initializer:
            value.place = host_place(value.dtype)
    placed = 0
    for node in graph:
        if node.pick is not None:
            declared = [v.dtype for v in node.outputs]
            place_outputs(node, node.pick)
            ctx.widened.update(v.name for v, was in zip(node.outputs, declared)
                               if was == TensorProto.FLOAT16 and v.dtype == TensorProto.FLOAT)
            placed += len(node.outputs)
    for value in list(graph.initializers.values()):
        if value.uses:
            place_constant(value)
            placed += 1
    for node in graph:
        for value in node.inputs:
            if value is not None and value.place is None and is_constant(value):
                place_constant(value)
    counts: dict[str, int] = {}
    for value in graph.values():
        if value.place is not None:
            counts[str(value.place)] = counts.get(str(value.place), 0) + 1
    result.data["values_by_place"] = dict(sorted(counts.items()))
    return result
