"""eliminate_deadend: nodes whose outputs reach no graph output are removed (bodies included).

    x -> A -> a (read by nobody) ...    becomes    x

One sweep in reverse order: a node's readers come after it, so when it is reached they are already gone if
they were dead. A body is swept before the node that holds it, so nodes of the body that read outer values
no longer keep those alive. ONNX ops have no side effects, so an unread result is never needed. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Graph
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass


def sweep(graph: Graph, removed: list[str]) -> None:
    for node in reversed(list(graph)):
        for body in node.subgraphs():
            sweep(body, removed)
        if not any(value.is_used for value in node.outputs):
            removed.append(node.name)
            graph.remove_node(node)


@register_pass(name="eliminate_deadend", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove nodes whose results reach no graph output")
def eliminate_deadend(ctx: PassContext) -> PassResult:
    result = PassResult()
    removed: list[str] = []
    sweep(ctx.graph, removed)
    if removed:
        result.rewrote({"rule": "eliminate_deadend", "from": removed, "to": []}, count=len(removed))
    return result
