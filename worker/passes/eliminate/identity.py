"""eliminate_identity: an Identity node is removed and its readers read its input.

    x -> Identity -> y    becomes    x (readers of y read x)

Refused only when ``y`` is a graph output that cannot keep its name (``x`` is a graph input or output, or
comes from an outer graph). Exact: no arithmetic changes.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class IdentityRule(ForwardRule):
    name = "eliminate_identity"
    op_types = ("Identity",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        source = node.input(0)
        return source if source is not None else "it has no input"


@register_pass(name="eliminate_identity", kind=PassKind.PROGRAM, level=1,
               description="remove Identity nodes; their readers read the input")
def eliminate_identity(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [IdentityRule()])
