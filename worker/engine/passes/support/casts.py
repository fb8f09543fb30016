"""Casts (Paddle-Lite's io_copy / calib / layout ops), each an own-domain op with a standard body:

    mirserve.io_copy(X) -> Y          = Identity            (a copy between memories)
    mirserve.calib(X) <to> -> Y       = Cast(to)            (fp32 <-> fp16)
    mirserve.layout(X) <perm> -> Y    = Transpose(perm)     (nchw <-> nhwc)

Inserting casts: one per (source value, destination type), shared by every consumer that needs it.

A cast is found again by looking at the source value's uses, so sharing needs no state between passes:
any consumer wanting the same conversion of the same value reads the existing cast's output. Constants are
never cast at run time: a converted copy goes into the file (again one per destination type) and the
original goes away once nothing reads it. A graph output keeps its name: the cast takes the name over and
the value it converts gets a fresh one.
"""
from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto, helper

from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels import Kernel, KernelTable
from worker.engine.kernels.pick import Pick, Port, Resolved
from worker.engine.mirserve_domain import ops as domain
from worker.engine.passes.support.placement import annotate
from worker.engine.places import Place, get_target

CAST_OPS = ("io_copy", "calib", "layout")
#: Standard ops that stand in for the casts in portable (standard ONNX only) output.
PORTABLE = {"io_copy": "Identity", "calib": "Cast", "layout": "Transpose"}


def is_cast(node: Node) -> bool:
    if node.domain == domain.DOMAIN and node.op_type in CAST_OPS:
        return True
    return node.domain == "" and node.metadata.get("mirserve.cast") in CAST_OPS


def cast_kind(node: Node) -> str | None:
    if node.domain == domain.DOMAIN and node.op_type in CAST_OPS:
        return node.op_type
    return node.metadata.get("mirserve.cast") if node.domain == "" else None


def widens_fp16(graph: Graph) -> bool:
    """The main graph converts run-time fp16 values to fp32 (a calib to fp32): fp32 kernels compute values
    the input model computed in fp16, which then differ from it by fp16's rounding."""
    return any(cast_kind(node) == "calib" and node.attr("to") == TensorProto.FLOAT
               and node.input(0) is not None and node.input(0).dtype == TensorProto.FLOAT16 for node in graph)


def cast_kernel(table: KernelTable, kind: str, target: str, variant: str) -> Kernel:
    """The cast kernel of ``target`` for a direction (Paddle-Lite's io_copy_kernel_pick)."""
    for kernel in table.kernels(kind, domain.DOMAIN, targets=[target]):
        if kernel.variant == variant or (kind == "io_copy" and not kernel.variant):
            return kernel
    raise LookupError(f"target {target} registers no {kind} kernel for {variant or 'its memory'}")


def find_shared(value: Value, kind: str, attributes: dict, place: Place) -> Value | None:
    """An existing cast of ``value`` of this kind, attributes and destination place."""
    for use in value.uses:
        node = use.node
        if cast_kind(node) != kind or node.graph is not value.graph and value.graph is not None:
            continue
        if all(node.attr(k) == v or (isinstance(v, (list, tuple)) and list(node.attr(k) or []) == list(v))
               for k, v in attributes.items()) and node.output().place == place:
            return node.output()
    return None


def insert_cast(graph: Graph, value: Value, kind: str, attributes: dict, place: Place, kernel: Kernel, *,
                before: Node | None, dtype: int, shape, portable: bool = False) -> Value:
    """A new cast of ``value`` producing a value of ``place``; placed before ``before`` (or at the end)."""
    op, op_domain = (PORTABLE[kind], "") if portable else (kind, domain.DOMAIN)
    node = graph.add_node(op, [value], [f"{value.name}_{kind}"], domain=op_domain, name=f"{kind}_{value.name}",
                          attributes=attributes, before=before)
    if portable:
        node.metadata["mirserve.cast"] = kind
    out = node.output()
    out.dtype, out.shape, out.place = dtype, shape, place
    annotate(node, cast_pick(kernel, value.place, place))
    return out


def cast_pick(kernel: Kernel, source: Place, destination: Place) -> Pick:
    """A cast's pick: it runs on its kernel's target and produces the destination's precision and layout."""
    ports = (Port(kernel.input_port(0).target or kernel.target, source.precision, source.layout),
             Port(kernel.output_port(0).target or kernel.target, destination.precision, destination.layout))
    return Pick(Resolved(kernel, destination.precision, destination.layout, ports[:1], ports[1:]))


def redirect_output(graph: Graph, old: Value, new: Value) -> None:
    """Make ``new`` the graph output ``old`` was, under ``old``'s name (``old`` gets a fresh one)."""
    name = old.name
    graph.rename_fresh(old, f"{name}_{(new.producer.op_type if new.producer else 'cast')}_in")
    graph.rename_value(new, name)
    for index, value in enumerate(graph.outputs):
        if value is old:
            graph.replace_output(index, new)


def converted_constant(graph: Graph, value: Value, place: Place, convert, key: str,
                       cache: dict[tuple[int, str, Place], Value]) -> Value:
    """A copy of constant ``value`` converted for ``place``, shared per destination through ``cache``."""
    found = cache.get((id(value), key, place))
    if found is not None and found.graph is graph:
        return found
    data = np.asarray(convert(np.asarray(value.constant_value())))
    new = graph.add_initializer(f"{value.name}_{key}", data)
    new.place = place
    cache[(id(value), key, place)] = new
    return new


def consumer_slots(graph: Graph) -> list[tuple[Node, int, Value]]:
    """Every (node, input slot, value) of the main graph in execution order, casts excluded."""
    found = []
    for node in list(graph):
        if is_cast(node) or node.pick is None:
            continue
        for slot, value in enumerate(node.inputs):
            if value is not None:
                found.append((node, slot, value))
    return found


def captured_reads(graph: Graph) -> list[tuple[Node, Node, int, Value]]:
    """(If/Loop/Scan node, body node, slot, value) for every value of ``graph`` that a body node reads. Bodies
    run in the model's own types, layout and host memory, never converted: such a value is brought back to
    them by a cast before the node that holds the body, when its producer now runs on another target, in
    another precision or in NHWC (the cast passes, each for its kind)."""
    found = []
    for node in list(graph):
        if node.pick is None:
            continue
        for body in node.subgraphs():
            for inner in body.all_nodes():
                found += [(node, inner, slot, value) for slot, value in enumerate(inner.inputs)
                          if value is not None and value.graph is graph and value.place is not None
                          and inner.pick is not None]
    return found


def same_memory(a: str, b: str) -> bool:
    return get_target(a).shares_memory_with(get_target(b))


FP16_MAX = float(np.finfo(np.float16).max)


def to_fp16(array: np.ndarray) -> np.ndarray:
    """fp16 copy of a float array; finite values beyond fp16's range saturate instead of becoming inf."""
    array = np.asarray(array)
    if array.dtype == np.float16:
        return array
    finite = np.isfinite(array)
    return np.where(finite, np.clip(array, -FP16_MAX, FP16_MAX), array).astype(np.float16)


def fits_fp16(array: np.ndarray) -> bool:
    """Every finite value is within fp16's range (storing it as fp16 loses precision, not magnitude)."""
    array = np.asarray(array, dtype=np.float64)
    finite = array[np.isfinite(array)]
    return finite.size == 0 or float(np.abs(finite).max()) <= FP16_MAX


def np_dtype(dtype: int):
    return helper.tensor_dtype_to_np_dtype(dtype)


def _register_casts() -> None:
    casts = [
        domain.DomainOp("io_copy", ("X",), ("Y",), {},
                        lambda opset: [helper.make_node("Identity", ["X"], ["Y"])],
                        "copy a tensor between the memories of two targets (Paddle-Lite's io_copy)"),
        domain.DomainOp("calib", ("X",), ("Y",), {"to": None},
                        lambda opset: [_with_refs(helper.make_node("Cast", ["X"], ["Y"]), {"to": 2})],
                        "convert a tensor's precision (Paddle-Lite's calib)"),
        domain.DomainOp("layout", ("X",), ("Y",), {"perm": None},
                        lambda opset: [_with_refs(helper.make_node("Transpose", ["X"], ["Y"]), {"perm": 7})],
                        "convert a tensor's layout (Paddle-Lite's layout op)"),
    ]
    for op in casts:
        if domain.get_op(op.name) is None:
            domain.register_op(op)


def _with_refs(node: NodeProto, attributes: dict[str, int]) -> NodeProto:
    node.attribute.extend(domain.ref(name, name, kind) for name, kind in attributes.items())
    return node


_register_casts()
