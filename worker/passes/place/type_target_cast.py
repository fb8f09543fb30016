"""type_target_cast: an io_copy wherever a value crosses between targets that do not share memory.

    y (opencl) -> Relu (arm)        ->  y -> mirserve.io_copy (opencl, device_to_host) -> Relu
    y (arm)    -> Relu (host)       ->  unchanged: host, x86 and arm share memory (as in Paddle-Lite)
    y (opencl) -> Conv (cuda)       ->  y -> io_copy to host -> io_copy to cuda -> Conv

One io_copy per (value, destination target), shared by all its consumers. Weights are not copied at run
time: they are loaded once where their consumer runs (Paddle-Lite's io_copy_once). A graph output must end
in host memory.
"""
from __future__ import annotations

from worker.ir import Graph, Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.place.casts import (cast_kernel, consumer_slots, declared, find_shared, insert_cast,
                                       redirect_output, same_memory)
from worker.passes.place.facts import fetch_place, is_constant
from worker.passes.registry import register_pass
from worker.places import HOST, Place, get_target


def copy_to(graph: Graph, value: Value, target: str, before: Node | None, portable: bool) -> Value:
    """``value`` in the memory of ``target``, through one or two shared io_copy casts."""
    source = value.place.target.name
    if same_memory(source, target):
        return value
    if not same_memory(source, HOST.name) and not same_memory(target, HOST.name):
        value = copy_to(graph, value, HOST.name, before, portable)
        source = value.place.target.name
    if same_memory(source, HOST.name):
        kernel = cast_kernel("io_copy", target, "host_to_device")
    else:
        kernel = cast_kernel("io_copy", source, "device_to_host")
    place = Place(get_target(target), value.place.precision, value.place.layout)
    shared = find_shared(value, "io_copy", {}, place)
    if shared is not None:
        return shared
    return insert_cast(graph, value, "io_copy", {}, place, kernel, before=before, dtype=value.dtype,
                       shape=value.shape, portable=portable)


@register_pass(name="type_target_cast", kind=PassKind.PROGRAM, level=1,
               description="insert io_copy where a value moves between targets that do not share memory")
def type_target_cast(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph, portable = ctx.graph, ctx.options.portable
    for node, slot, value in consumer_slots(graph):
        if value.place is None or is_constant(value):
            continue
        target = declared(node, slot)[2]
        if same_memory(value.place.target.name, target):
            continue
        moved = copy_to(graph, value, target, node, portable)
        node.set_input(slot, moved)
        result.rewrote({"value": value.name, "to": target, "consumer": node.name})
    for value in list(graph.outputs):
        fetch = fetch_place(graph, value)
        if value.place is not None and not same_memory(value.place.target.name, fetch.target.name):
            moved = copy_to(graph, value, fetch.target.name, None, portable)
            redirect_output(graph, value, moved)
            result.rewrote({"value": value.name, "to": fetch.target.name, "consumer": "graph output"})
    return result
