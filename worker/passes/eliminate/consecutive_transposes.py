"""fuse_consecutive_transposes: two Transposes in a row become one (or none, when they cancel).

    x -> Transpose(p1) -> t -> Transpose(p2) -> y    becomes    x -> Transpose(p1[p2]) -> y
                                                       or           x    (when p1[p2] is the identity)

Output axis i of the second reads axis p2[i] of ``t``, which is axis p1[p2[i]] of ``x``. The second
Transpose is changed in place to read ``x``; the first goes away once nothing else reads it. Exact.
"""
from __future__ import annotations

from worker.ir import Graph, Node
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import remove_dead
from worker.passes.eliminate.forward import forward, forward_refusal, is_attached
from worker.passes.registry import register_pass


def permutation(node: Node) -> list[int] | None:
    perm = node.attr("perm")
    if perm is not None:
        return [int(p) for p in perm]
    rank = node.input(0).rank
    return None if rank is None else list(reversed(range(rank)))


def compose(graph: Graph, second: Node, result: PassResult) -> None:
    first = second.input(0).producer
    p1, p2 = permutation(first), permutation(second)
    if p1 is None or p2 is None or len(p1) != len(p2):
        result.refused("fuse_consecutive_transposes: the permutations are not known")
        return
    source = first.input(0)
    composed = [p1[axis] for axis in p2]
    names = [first.name, second.name]
    if composed == list(range(len(composed))) and forward_refusal(second, source) is None:
        forward(graph, second, source)
        remove_dead(first.graph, first)
        result.rewrote({"rule": "fuse_consecutive_transposes", "from": names, "to": []})
        return
    second.set_input(0, source)
    second.set_attr("perm", composed)
    remove_dead(first.graph, first)
    result.rewrote({"rule": "fuse_consecutive_transposes", "from": names,
                    "to": [second.name] if first.graph is None else names})


@register_pass(name="fuse_consecutive_transposes", kind=PassKind.PROGRAM, level=1,
               description="compose two consecutive Transposes into one, or none when they cancel")
def fuse_consecutive_transposes(ctx: PassContext) -> PassResult:
    result = PassResult()
    for graph in list(ctx.graph.all_graphs()):
        for node in graph.nodes_of_type("Transpose"):
            producer = node.input(0).producer if node.input(0) is not None else None
            if node.graph is graph and producer is not None and producer.is_op("Transpose") \
                    and is_attached(graph, ctx.graph):
                compose(graph, node, result)
    return result
