"""constant_to_initializer: a Constant node becomes an initializer of the main graph, under the same name.

    Constant(value=t) -> c -> readers    becomes    initializer c = t -> readers

Initializers are what runtimes pre-pack and what every later pass reads as a weight; a Constant inside a
Loop body would otherwise run on every iteration. Names are unique model-wide, so a body's Constant moves to
the main graph and its readers see it from the outer scope. Refused for a Constant that is itself a graph
output (it must stay produced by a node) and for string or sparse values. Exact.
"""
from __future__ import annotations

from worker.ir import Graph, Node
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import replace_with_constant
from worker.passes.eliminate.forward import is_attached
from worker.passes.registry import register_pass


def to_initializer(graph: Graph, node: Node) -> str | None:
    """Replace the Constant ``node``; returns why not, or None when done."""
    out = node.output()
    if out.is_graph_output:
        return f"its output {out.name!r} is a graph output"
    data = node.constant_output()
    if data is None:
        return "it holds a sparse or string value"
    initializer = replace_with_constant(graph, out, data)
    initializer.doc_string = node.doc_string
    graph.remove_node(node)
    return None


@register_pass(name="constant_to_initializer", kind=PassKind.PROGRAM, level=1,
               description="turn Constant nodes into initializers of the main graph, names kept")
def constant_to_initializer(ctx: PassContext) -> PassResult:
    result = PassResult()
    converted: list[str] = []
    for graph in list(ctx.graph.all_graphs()):
        for node in graph.nodes_of_type("Constant"):
            if not is_attached(graph, ctx.graph):
                continue
            name = node.name
            reason = to_initializer(graph, node)
            if reason is None:
                converted.append(name)
            else:
                result.refused(f"constant_to_initializer: {reason}")
    if converted:
        result.rewrote({"rule": "constant_to_initializer", "from": converted, "to": []}, count=len(converted))
    return result
