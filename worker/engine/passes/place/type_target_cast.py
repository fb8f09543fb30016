"""type_target_cast: an io_copy wherever a value crosses between targets that do not share memory.

    y (opencl) -> Relu (arm)        ->  y -> mirserve.io_copy (opencl, device_to_host) -> Relu
    y (arm)    -> Relu (host)       ->  unchanged: host, x86 and arm share memory (as in Paddle-Lite)
    y (opencl) -> Conv (cuda)       ->  y -> io_copy to host -> io_copy to cuda -> Conv

One io_copy per (value, destination target), shared by all its consumers. Weights are not copied at run
time: they are loaded once where their consumer runs (Paddle-Lite's io_copy_once). A graph output must end
in host memory. Sequences, maps and optionals are not copied: no io_copy takes one (its function body is a
tensor Identity), and runtimes keep them in host memory (onnxruntime's CUDA provider runs sequence ops on
the CPU).
"""
from __future__ import annotations

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.casts import (captured_reads, cast_kernel, consumer_slots, find_shared,
                                                insert_cast, redirect_output, same_memory)
from worker.engine.passes.support.placement import fetch_place, is_constant
from worker.engine.places import HOST, Place, get_target


def copy_to(ctx: PassContext, value: Value, target: str, before: Node | None) -> Value:
    """``value`` in the memory of ``target``, through one or two shared io_copy casts."""
    source = value.place.target.name
    if same_memory(source, target):
        return value
    if not same_memory(source, HOST.name) and not same_memory(target, HOST.name):
        value = copy_to(ctx, value, HOST.name, before)
        source = value.place.target.name
    if same_memory(source, HOST.name):
        kernel = cast_kernel(ctx.kernels, "io_copy", target, "host_to_device")
    else:
        kernel = cast_kernel(ctx.kernels, "io_copy", source, "device_to_host")
    place = Place(get_target(target), value.place.precision, value.place.layout)
    shared = find_shared(value, "io_copy", {}, place)
    if shared is not None:
        return shared
    return insert_cast(ctx.graph, value, "io_copy", {}, place, kernel, before=before, dtype=value.dtype,
                       shape=value.shape, portable=ctx.options.portable)


@register_pass(name="type_target_cast", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="insert io_copy where a value moves between targets that do not share memory")
def type_target_cast(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph = ctx.graph
    for node, slot, value in consumer_slots(graph):
        if value.place is None or is_constant(value) or value.type_proto is not None:
            continue
        target = node.pick.input(slot).target
        if same_memory(value.place.target.name, target):
            continue
        moved = copy_to(ctx, value, target, node)
        node.set_input(slot, moved)
        result.rewrote({"value": value.name, "to": target, "consumer": node.name})
    for node, inner, slot, value in captured_reads(graph):  # a body reads it: copied before the node with the body
        target = inner.pick.input(slot).target
        if is_constant(value) or value.type_proto is not None or same_memory(value.place.target.name, target):
            continue
        inner.set_input(slot, copy_to(ctx, value, target, node))
        result.rewrote({"value": value.name, "to": target, "consumer": inner.name})
    for value in list(graph.outputs):
        fetch = fetch_place(ctx, value)
        if value.place is not None and value.type_proto is None and not same_memory(value.place.target.name,
                                                                            fetch.target.name):
            moved = copy_to(ctx, value, fetch.target.name, None)
            redirect_output(graph, value, moved)
            result.rewrote({"value": value.name, "to": fetch.target.name, "consumer": "graph output"})
    return result
