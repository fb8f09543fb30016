"""type_cast_cleanup: remove casts that cancel, fold casts of constants, merge duplicate casts.

    x -> layout(0,2,3,1) -> layout(0,3,1,2) -> y     ->  x -> y             (nchw -> nhwc -> nchw)
    x -> io_copy(a -> b) -> io_copy(b -> a) -> y     ->  x -> y
    x (arm) -> io_copy -> y (host)                   ->  x -> y             (one memory: no copy)
    x16 -> calib(float) -> calib(float16) -> y       ->  x16 -> y           (fp16 -> fp32 -> fp16 is exact)
    x32 -> calib(float16) -> calib(float) -> y       ->  unchanged          (rounds to fp16: not a no-op)
    w (constant) -> calib(float16) -> Conv           ->  w16 (initializer) -> Conv
    two casts of one value to one place              ->  one

Chains appear when a model that already went through mirserve is optimized again for other places, and
when a value's producer and a consumer straddle a cast inserted for someone else.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Graph, Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.casts import cast_kind, is_cast, same_memory
from worker.engine.passes.support.placement import is_constant


def _cancels(first: Node, second: Node) -> bool:
    kind = cast_kind(first)
    if kind != cast_kind(second):
        return False
    source, result = first.input(0), second.output()
    if kind == "layout":
        perm_a, perm_b = first.attr("perm"), second.attr("perm")
        return perm_a is not None and perm_b is not None and [perm_a[i] for i in perm_b] == list(range(len(perm_a)))
    if kind == "io_copy":
        return source.place is not None and result.place is not None and source.place == result.place
    # calib: exact only when the middle precision is the wider one (fp16 -> fp32 -> fp16)
    return (source.dtype == result.dtype and first.output().dtype != 0
            and np.dtype(_np(first.output().dtype)).itemsize >= np.dtype(_np(source.dtype)).itemsize)


def _np(dtype: int):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(dtype)


def _replace(graph: Graph, old: Value, new: Value) -> bool:
    if old.is_graph_output:
        return graph.bypass(old, new)
    graph.replace_all_uses(old, new)
    return True


def cancel_chains(graph: Graph) -> int:
    cancelled = 0
    for node in list(graph):
        if node.graph is not graph or not is_cast(node):
            continue
        first = node.input(0).producer if node.input(0) is not None else None
        if first is None or not is_cast(first) or not _cancels(first, node):
            continue
        if _replace(graph, node.output(), first.input(0)):
            graph.remove_unused([node, first])
            cancelled += 1
    return cancelled


def _is_noop(node: Node) -> bool:
    """A copy within one memory, a calib to the type it has, a layout cast with the identity perm."""
    kind, source, result = cast_kind(node), node.input(0), node.output()
    if kind == "io_copy":
        return (source.place is not None and result.place is not None
                and same_memory(source.place.target.name, result.place.target.name))
    if kind == "calib":
        return source.dtype != 0 and source.dtype == node.attr("to")
    perm = node.attr("perm")
    return perm is not None and list(perm) == list(range(len(perm)))


def drop_noops(graph: Graph) -> int:
    dropped = 0
    for node in list(graph):
        if node.graph is graph and is_cast(node) and _is_noop(node):
            if _replace(graph, node.output(), node.input(0)):
                graph.remove_unused([node])
                dropped += 1
    return dropped


def fold_constant_casts(graph: Graph) -> int:
    folded = 0
    for node in list(graph):
        if node.graph is not graph or not is_cast(node) or not is_constant(node.input(0)):
            continue
        data = np.asarray(node.input(0).constant_value())
        kind = cast_kind(node)
        if kind == "calib":
            data = data.astype(_np(node.attr("to")))
        elif kind == "layout":
            data = np.transpose(data, node.attr("perm"))
        out = node.output()
        folded_value = graph.add_initializer(f"{out.name}_folded", data)
        folded_value.place = out.place
        if _replace(graph, out, folded_value):
            source = node.input(0)
            graph.remove_unused([node])
            graph.remove_unused([source])
            folded += 1
        else:
            graph.remove_initializer(folded_value)
    return folded


def merge_duplicates(graph: Graph) -> int:
    merged = 0
    for node in list(graph):
        if node.graph is not graph or not is_cast(node):
            continue
        for use in list(node.input(0).uses):
            other = use.node
            if other is node or other.graph is not graph or cast_kind(other) != cast_kind(node):
                continue
            same_attrs = {k: a.value for k, a in other.attributes.items()} == \
                {k: a.value for k, a in node.attributes.items()}
            if same_attrs and other.output().place == node.output().place and other.position > node.position:
                if _replace(graph, other.output(), node.output()):
                    graph.remove_unused([other])
                    merged += 1
    return merged


@register_pass(name="type_cast_cleanup", kind=PassKind.PROGRAM, level=1,
               description="remove cast chains that cancel, fold casts of constants, merge duplicate casts")
def type_cast_cleanup(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph = ctx.graph
    counts = {"no_ops": drop_noops(graph), "cancelled": cancel_chains(graph),
              "folded": fold_constant_casts(graph), "merged": merge_duplicates(graph)}
    result.rewrites = sum(counts.values())
    result.data.update(counts)
    return result
