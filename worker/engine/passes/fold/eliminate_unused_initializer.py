"""eliminate_unused_initializer: initializers nothing reads are removed (bodies included).

Initializers that are also graph inputs are left alone: the user may feed them. Exact.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass


@register_pass(name="eliminate_unused_initializer", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove initializers that nothing reads")
def eliminate_unused_initializer(ctx: PassContext) -> PassResult:
    result = PassResult()
    removed: list[str] = []
    for graph in ctx.graph.all_graphs():
        for value in list(graph.initializers.values()):
            if not value.is_used and not value.is_graph_input:
                removed.append(value.name)
                graph.remove_initializer(value)
    if removed:
        result.rewrote(count=len(removed))
        result.data["initializers_removed"] = removed
    return result
