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
from worker import domain
from worker.kernels.ops import NHWC_PREFIX, nhwc_slots
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.place.facts import Pick, host_place, is_constant, set_fetch
from worker.passes.registry import register_pass
from worker.places import Layout, Place, Precision, dtype_of_precision, get_target, precision_of_dtype

TO_NHWC = (0, 2, 3, 1)
FLOAT_DTYPES = (1, 10)  # float, float16: the element types a calib converts between


def _effective_shape(value: Value, layout: Layout):
    """The shape ``value`` will have where a consumer reads it in ``layout`` (after any layout cast)."""
    shape = value.shape
    if shape is None or layout is Layout.ANY:
        return shape
    current = value.place.layout if value.place is not None else Layout.NCHW
    if len(shape) < 4 and layout is Layout.NHWC and is_constant(value) and (value.numel() or 0) > 1:
        shape = (1,) * (4 - len(shape)) + tuple(shape)  # a constant lifted to rank 4
        current = Layout.NCHW
    if len(shape) != 4 or current is layout:
        return shape
    return tuple(shape[i] for i in (TO_NHWC if layout is Layout.NHWC else (0, 3, 1, 2)))


def _broadcast(shapes) -> tuple | None:
    """Numpy broadcasting over shapes whose dims may be symbolic (str) or unknown (None)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        known = [d for d in dims if d != 1]
        result.append(known[0] if known else 1)
    return tuple(result)


def _output_shape(node, pick: Pick, value: Value, layout: Layout):
    """NHWC outputs: a wrapped layout-sensitive node's NCHW result permuted; an elementwise node's the
    broadcast of its inputs as they will arrive; anything else as type inference gave it."""
    if layout is not Layout.NHWC or value.shape is None or len(value.shape) != 4:
        return value.shape
    if pick.kernel.layout is Layout.NHWC:
        wrapped = (node.op_type, node.domain) == (pick.kernel.op, pick.kernel.domain) and \
            nhwc_slots(node.op_type, node.domain) is not None
        return tuple(value.shape[i] for i in TO_NHWC) if wrapped else value.shape
    shapes = [_effective_shape(v, layout) for v in node.inputs if v is not None]
    merged = _broadcast(shapes)
    return merged if merged is not None and len(merged) == 4 else value.shape


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
        if value.place is None or value.place.layout is not layout:
            value.shape = _output_shape(node, pick, value, layout)
        value.place = Place(get_target(target), precision, layout)


def place_constant(value: Value) -> None:
    """A weight lives where its first consumer runs; its data is NCHW, unless that consumer is an NHWC
    form mirserve wrote earlier (a model optimized again), whose weights are stored NHWC already."""
    consumer = next((u for u in value.uses if isinstance(u.node.kernel, Pick)), None)
    if consumer is None:
        value.place = Place(host_place(0).target, precision_of_dtype(value.dtype), Layout.NCHW)
        return
    _, declared_layout, target = consumer.node.kernel.resolved.inputs[consumer.slot]
    native = consumer.node.domain == domain.DOMAIN and consumer.node.op_type.startswith(NHWC_PREFIX)
    layout = Layout.NHWC if native and declared_layout is Layout.NHWC and value.rank == 4 else Layout.NCHW
    value.place = Place(get_target(target), precision_of_dtype(value.dtype), layout)


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
