"""eliminate_if_with_const_cond: an If whose condition is known at optimization time is replaced by the
nodes of the branch it takes.

    If(cond=true, then={a = Relu(x)}, else={...}) -> y    becomes    a = Relu(x), readers of y read a

The branch's nodes move into the If's graph in order, before the If, keeping their names (names are unique
model-wide); its initializers move to the main graph. Each If output is then bypassed by the branch output,
or, when that is impossible (the If output is a graph output and the branch output comes from an outer
scope), produced by an Identity of it. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.ir import Graph, Node
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import bypass_refusal, hoist_initializer, move_node
from worker.passes.eliminate.forward import is_attached
from worker.passes.registry import register_pass


def chosen_branch(node: Node) -> Graph | None:
    condition = node.input(0).constant_value() if node.input(0) is not None else None
    if condition is None or condition.size != 1:
        return None
    return node.attr("then_branch" if bool(np.asarray(condition).reshape(-1)[0]) else "else_branch")


def inline(graph: Graph, node: Node, branch: Graph) -> list[str]:
    """Move the branch into ``graph`` in place of ``node``; returns the names of the nodes now standing in."""
    results = list(branch.outputs)
    branch.set_outputs([])
    for value in list(branch.initializers.values()):
        hoist_initializer(value, graph.root)
    moved = list(branch)
    for inner in moved:
        move_node(inner, graph, node)
    names = [inner.name for inner in moved]
    for out, result in zip(node.outputs, results):
        if not out.is_used:
            continue
        if bypass_refusal(out, result) is None:
            graph.bypass(out, result)
        else:
            identity = graph.add_node("Identity", [result], [out], name=f"{node.name}_{out.name}", before=node)
            names.append(identity.name)
    graph.remove_node(node)
    return names


@register_pass(name="eliminate_if_with_const_cond", kind=PassKind.PROGRAM, level=1,
               description="replace an If whose condition is constant by the nodes of the branch it takes")
def eliminate_if_with_const_cond(ctx: PassContext) -> PassResult:
    result = PassResult()
    for graph in list(ctx.graph.all_graphs()):
        for node in graph.nodes_of_type("If"):
            if node.graph is not graph or not is_attached(graph, ctx.graph):
                continue
            branch = chosen_branch(node)
            if branch is None:
                continue
            name = node.name
            result.rewrote({"rule": "eliminate_if_with_const_cond", "from": [name],
                            "to": inline(graph, node, branch)})
    return result
