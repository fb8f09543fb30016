"""remove_initializer_from_input: graph inputs that have an initializer stop being inputs; they become
constants that folding and fusions may use.

Before IR version 4 every initializer had to be listed as a graph input, which made every weight
overridable by the user and therefore not a constant (the light model zoo is written that way). Dropping
them from the inputs needs IR version 4 or later, so the model's IR version is raised to 4 when it is lower.
Only the main graph's inputs are touched. The model computes the same for every input it is still fed.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass

#: First IR version in which an initializer need not be a graph input.
IR_VERSION_WITH_FREE_INITIALIZERS = 4


@register_pass(name="remove_initializer_from_input", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="graph inputs backed by an initializer become constants (IR version raised to 4)")
def remove_initializer_from_input(ctx: PassContext) -> PassResult:
    result = PassResult()
    graph = ctx.graph
    moved = [value for value in graph.inputs if value.is_initializer]
    for value in moved:
        graph.remove_input(value)
    if moved:
        if ctx.model.ir_version < IR_VERSION_WITH_FREE_INITIALIZERS:
            result.data["ir_version"] = {"from": ctx.model.ir_version, "to": IR_VERSION_WITH_FREE_INITIALIZERS}
            ctx.model.ir_version = IR_VERSION_WITH_FREE_INITIALIZERS
        result.rewrote(count=len(moved))
        result.data["inputs_removed"] = [value.name for value in moved]
    return result
