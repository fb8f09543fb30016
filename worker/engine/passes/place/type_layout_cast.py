"""type_layout_cast: a layout cast (a Transpose) wherever a value's layout differs from its consumer's.

    y (nchw) -> Conv (arm nhwc)     ->  y -> mirserve.layout(perm=0,2,3,1) -> mirserve.NhwcConv
    w (nchw weight) -> Conv (nhwc)  ->  w_nhwc (transposed initializer, OHWI) -> NhwcConv      (offline)
    b [C,1,1] -> Add (nhwc)         ->  b_nhwc [1,1,1,C] (constant lifted to rank 4 and transposed)
    y (nhwc) -> graph output        ->  y -> layout(perm=0,3,1,2) -> output, under the output's name

Only rank-4 tensors have a layout. A node on an NHWC kernel of a layout-sensitive op then becomes its NHWC
form (worker.engine.passes.support.nhwc). One layout cast per (value, layout), shared by all consumers.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels.ops import nhwc_slots
from worker.engine.kernels.pick import Pick, Port
from worker.engine.mirserve_domain import ops as domain
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support import qdq
from worker.engine.passes.support.casts import (captured_reads, cast_kernel, consumer_slots, converted_constant,
                                                find_shared, insert_cast, redirect_output)
from worker.engine.passes.support.nhwc import (TO_NCHW, TO_NHWC, complete_attributes, is_biased, nhwc_form,
                                               register_nhwc)
from worker.engine.passes.support.placement import annotate, fetch_place, is_constant, node_opset
from worker.engine.places import Layout, Place, Precision, get_target

PERM = {Layout.NHWC: TO_NHWC, Layout.NCHW: TO_NCHW}


def _lift(array: np.ndarray, layout: Layout) -> np.ndarray:
    if array.ndim < 4:
        array = array.reshape((1,) * (4 - array.ndim) + array.shape)
    return np.transpose(array, PERM[layout])


def relaid(ctx: PassContext, value: Value, layout: Layout, target: str, before: Node | None,
           cache: dict) -> Value:
    graph = ctx.graph
    place = Place(get_target(target), value.place.precision, layout)
    if is_constant(value):
        return converted_constant(graph, value, place, lambda a: _lift(a, layout), layout.value, cache)
    perm = list(PERM[layout])
    shared = find_shared(value, "layout", {"perm": perm}, place)
    if shared is not None:
        return shared
    kernel = cast_kernel(ctx.kernels, "layout", target, f"{value.place.layout.value}_to_{layout.value}")
    shape = tuple(value.shape[i] for i in perm) if value.shape is not None else None
    return insert_cast(graph, value, "layout", {"perm": perm}, place, kernel, before=before,
                       dtype=value.dtype, shape=shape, portable=ctx.options.portable)


def _needs(value: Value, wanted: Layout) -> bool:
    if wanted is Layout.ANY or value.place is None:
        return False
    if value.rank == 4:
        return value.place.layout is not wanted
    # lower-rank constants broadcast against NHWC data must be laid out like it
    return wanted is Layout.NHWC and is_constant(value) and (value.numel() or 0) > 1


def wrap_nhwc(graph: Graph, node: Node, opset: int) -> Node | None:
    """Replace a node picked on an NHWC kernel by its own-domain NHWC form."""
    pick = node.pick
    form = nhwc_form(node.op_type, node.domain, opset)
    if form is None:
        return None
    register_nhwc(form)
    weight = node.input(1)
    source_shape = None
    if weight is not None and weight.shape is not None and len(weight.shape) == 4:
        source_shape = tuple(weight.shape[i] for i in TO_NCHW)  # the weight is NHWC (OHWI) by now
    attributes = complete_attributes(form, {k: a.value for k, a in node.attributes.items()}, source_shape)
    inputs = list(node.inputs)
    if len(inputs) < len(form.inputs) and is_biased(form.op):  # every input passed: a zero bias
        inputs.append(_zero_bias(graph, node, source_shape, attributes.get("group", 1)))
        resolved = pick.resolved
        bias = Port(pick.kernel.target, resolved.precision, Layout.NCHW)
        pick = Pick(dataclasses.replace(resolved, inputs=resolved.inputs + (bias,)), pick.qdq)
    wrapped = graph.add_node(form.name, inputs, list(node.outputs), domain=domain.DOMAIN,
                             name=node.name + NHWC_SUFFIX, attributes=attributes, before=node)
    graph.remove_node(node)
    annotate(wrapped, pick)
    return wrapped


#: What the NHWC form of a node adds to its name.
NHWC_SUFFIX = "_nhwc"


def picked_name(node: Node) -> str:
    """The name ``node`` had when kernel pick chose its kernel (its NHWC form and the quantized node made of a
    Q/DQ sandwich are renamed after)."""
    name = node.name
    if node.domain == domain.DOMAIN and node.op_type.startswith("Nhwc") and name.endswith(NHWC_SUFFIX):
        name = name[:-len(NHWC_SUFFIX)]
    if node.pick is not None and node.pick.absorbed and name.endswith(qdq.QUANTIZED_SUFFIX):
        name = name[:-len(qdq.QUANTIZED_SUFFIX)]
    return name


def _zero_bias(graph: Graph, node: Node, weight_shape, group: int) -> Value:
    """Zeros for a convolution's missing bias, one per output channel (weight_shape in NCHW order)."""
    transposed = node.op_type.startswith("ConvTranspose") or node.op_type.startswith("FusedConvTranspose")
    channels = weight_shape[1] * group if transposed else weight_shape[0]
    precision = node.pick.resolved.precision
    dtype = np.float16 if precision is Precision.FP16 else np.float32
    bias = graph.add_initializer(f"{node.name}_zero_bias", np.zeros(int(channels), dtype))
    bias.place = Place(get_target(node.pick.kernel.target), precision, Layout.NCHW)
    return bias


@register_pass(name="type_layout_cast", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="insert layout casts (Transpose) where layouts differ, transpose weights "
                           "offline, and write NHWC nodes in their NHWC form")
def type_layout_cast(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph, cache = ctx.graph, {}
    for node, slot, value in consumer_slots(graph):
        port = node.pick.input(slot)
        wanted = port.layout
        if not _needs(value, wanted):
            continue
        node.set_input(slot, relaid(ctx, value, wanted, port.target, node, cache))
        graph.remove_unused([value])
        result.rewrote({"value": value.name, "to": wanted.value, "consumer": node.name})
    for node, inner, slot, value in captured_reads(graph):  # bodies read the model's own layout, NCHW
        if value.rank != 4 or value.place.layout is not Layout.NHWC or is_constant(value):
            continue
        inner.set_input(slot, relaid(ctx, value, Layout.NCHW, value.place.target.name, node, cache))
        result.rewrote({"value": value.name, "to": Layout.NCHW.value, "consumer": inner.name})
    wrapped = 0
    for node in list(graph):
        pick = node.pick
        # layout-agnostic kernels (layout any) run NHWC as they are; NHWC kernels need the NHWC form
        if (pick is not None and pick.kernel.layout is Layout.NHWC
                and (node.op_type, node.domain) == (pick.kernel.op, pick.kernel.domain)
                and nhwc_slots(node.op_type, node.domain) is not None):
            if wrap_nhwc(graph, node, node_opset(ctx.model.opset, node)) is not None:
                wrapped += 1
    result.data["nhwc_nodes"] = wrapped
    for value in list(graph.outputs):
        fetch = fetch_place(ctx, value)
        if value.place is None or value.rank != 4 or value.place.layout is fetch.layout:
            continue
        relaid_value = relaid(ctx, value, fetch.layout, value.place.target.name, None, cache)
        redirect_output(graph, value, relaid_value)
        result.rewrote({"value": value.name, "to": fetch.layout.value, "consumer": "graph output"})
    return result
