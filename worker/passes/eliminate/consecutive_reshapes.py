"""fuse_consecutive_reshapes: a Reshape of a view op's output (Reshape, Flatten, Squeeze, Unsqueeze) reads
the view's input directly.

    x -> Reshape(s1) -> t -> Reshape(s2) -> y    becomes    x -> Reshape(s2') -> y    (or x, when y ~ x)

A view never reorders elements, so only the final shape matters. ``s2'`` is the static output shape when type
inference knows it; otherwise ``s2`` with each 0 (copy a dim of ``t``) kept when ``t`` and ``x`` have the same
dim there, or replaced by ``t``'s static dim. The first op goes away once nothing else reads it. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.ir import Graph, Node
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import add_constant, int_list, remove_dead, same_dim, same_shape, static_shape
from worker.passes.eliminate.forward import forward, forward_refusal, is_attached
from worker.passes.registry import register_pass

VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def resolved_target(second: Node) -> list[int] | str:
    """The second Reshape's target, valid when read against the first op's input."""
    static = static_shape(second.output())
    if static is not None and (0 not in static or second.attr("allowzero", 0)):
        return list(static)
    target = int_list(second.input(1))
    if target is None:
        return "the target shape is not known at optimization time"
    if second.attr("allowzero", 0):
        return target
    middle, source = second.input(0), second.input(0).producer.input(0)
    resolved = []
    for i, wanted in enumerate(target):
        if wanted != 0:
            resolved.append(wanted)
        elif middle.shape is not None and source.shape is not None and i < min(len(middle.shape),
                                                                               len(source.shape)) \
                and same_dim(middle.shape[i], source.shape[i]):
            resolved.append(0)
        elif middle.shape is not None and i < len(middle.shape) and isinstance(middle.shape[i], int):
            resolved.append(middle.shape[i])
        else:
            return f"entry {i} of the target copies a dim that is not known"
    return resolved


def fuse(graph: Graph, second: Node, result: PassResult) -> None:
    first = second.input(0).producer
    source = first.input(0)
    target = resolved_target(second)
    if isinstance(target, str):
        result.refused(f"fuse_consecutive_reshapes: {target}")
        return
    names = [first.name, second.name]
    if same_shape(source.shape, second.output().shape) and forward_refusal(second, source) is None:
        forward(graph, second, source)
        remove_dead(first.graph, first)
        result.rewrote({"rule": "fuse_consecutive_reshapes", "from": names, "to": []})
        return
    if target != int_list(second.input(1)):
        second.set_input(1, add_constant(graph.root, f"{second.name}_shape", np.array(target, dtype=np.int64)))
    second.set_input(0, source)
    remove_dead(first.graph, first)
    result.rewrote({"rule": "fuse_consecutive_reshapes", "from": names,
                    "to": [second.name] if first.graph is None else names})


@register_pass(name="fuse_consecutive_reshapes", kind=PassKind.PROGRAM, level=1,
               description="a Reshape after Reshape/Flatten/Squeeze/Unsqueeze reads the first op's input")
def fuse_consecutive_reshapes(ctx: PassContext) -> PassResult:
    if ctx.opset() < 5:
        return PassResult()  # Reshape keeps its shape as an attribute before opset 5
    result = PassResult()
    for graph in list(ctx.graph.all_graphs()):
        for node in graph.nodes_of_type("Reshape"):
            producer = node.input(0).producer if node.input(0) is not None else None
            if node.graph is graph and producer is not None and producer.op_type in VIEW_OPS \
                    and not producer.domain and is_attached(graph, ctx.graph):
                fuse(graph, node, result)
    return result
