"""variable_place_inference: every value gets a place (target, precision, layout).

    x (graph input)     -> host / its dtype / nchw          (the feed contract)
    y = Conv(x, w)      -> the picked kernel's declared output, e.g. arm / fp16 / nhwc: dtype float16,
                           shape [N, H, W, C]
    w (a constant)      -> its first consumer's target, its own dtype, nchw: the cast passes convert it
                           offline to what each consumer declares (fp16 weights stored as fp16, NHWC
                           weights transposed in the file); it is never copied at run time
    graph outputs       -> must leave as host / their dtype / nchw (the fetch contract, recorded here)

A value of rank other than 4 has no layout of its own and is kept as nchw. Outputs a kernel declares with
precision ``any`` keep the element type type inference gave them.
"""
from __future__ import annotations

from worker.ir import Graph, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.place.facts import Pick, host_place, is_constant, set_fetch
from worker.passes.registry import register_pass
from worker.places import Layout, Place, Precision, dtype_of_precision, get_target, precision_of_dtype

TO_NHWC = (0, 2, 3, 1)
FLOAT_DTYPES = (1, 10)  # float, float16: the element types a calib converts between


def place_outputs(node, pick: Pick) -> None:
    """Give a picked node's outputs the places its kernel declares (dtype and NHWC shape follow)."""
    for slot, value in enumerate(node.outputs):
        precision, layout, target = pick.resolved.outputs[slot]
        if precision is Precision.ANY or value.dtype not in FLOAT_DTYPES or precision not in (
                Precision.FP32, Precision.FP16):
            precision = precision if precision is not Precision.ANY else precision_of_dtype(value.dtype)
        else:
            value.dtype = dtype_of_precision(precision)
        if layout is Layout.ANY or value.rank != 4:
            layout = Layout.NCHW
        if layout is Layout.NHWC and (value.place is None or value.place.layout is not Layout.NHWC):
            value.shape = tuple(value.shape[i] for i in TO_NHWC)
        value.place = Place(get_target(target), precision, layout)


def place_constant(value: Value) -> None:
    consumer = next((u for u in value.uses if isinstance(u.node.kernel, Pick)), None)
    target = get_target(consumer.node.kernel.resolved.inputs[consumer.slot][2]) if consumer else host_place(0).target
    value.place = Place(target, precision_of_dtype(value.dtype), Layout.NCHW)


@register_pass(name="variable_place_inference", kind=PassKind.STMT, level=1,
               description="give every value a place: graph inputs and outputs on the host (own dtype, "
                           "nchw), node outputs as their kernel declares, weights as their consumer reads")
def variable_place_inference(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph: Graph = ctx.graph
    for value in graph.outputs:
        set_fetch(graph, value, host_place(value.dtype))
    for value in graph.inputs:
        if not value.is_initializer:
            value.place = host_place(value.dtype)
    placed = 0
    for node in graph:
        if isinstance(node.kernel, Pick):
            place_outputs(node, node.kernel)
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
