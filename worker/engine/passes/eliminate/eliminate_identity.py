"""eliminate_identity: an Identity node is removed and its readers read its input.

    x -> Identity -> y    becomes    x (readers of y read x)

Refused only when ``y`` is a graph output that cannot keep its name (``x`` is a graph input or output, or
comes from an outer graph). Exact: no arithmetic changes.
"""
from __future__ import annotations

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class IdentityRule(Rule):
    name = "eliminate_identity"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Identity(p.var("x"))
        return p

    def check(self, ctx: PassContext, match: Match) -> Value:
        return match.value("x")


@register_pass(name="eliminate_identity", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Identity nodes; their readers read the input")
def eliminate_identity(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [IdentityRule()])
