"""identity_dropout_eliminate: Dropout in inference mode is the identity (NNVM SimplifyInference).

    x -> Dropout -> y (, mask unused)    becomes    x

Opset 12 on: only when the ``training_mode`` input is absent or a constant false. Before opset 7: only when
``is_test`` is set (its default is training). Refused when the mask output is used. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class DropoutRule(Rule):
    name = "identity_dropout_eliminate"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Dropout(p.var("x"), key="dropout")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        node = match.node("dropout")
        opset = ctx.opset()
        if opset < 7 and not node.attr("is_test", 0):
            return "is_test is not set, so this Dropout-6 runs in training mode"
        mode = node.input(2) if opset >= 12 else None
        if mode is not None:
            data = mode.constant_value()
            if data is None:
                return "its training_mode input is not known at optimization time"
            if bool(np.asarray(data).reshape(-1)[0]):
                return "its training_mode input is true"
        return match.value("x")


@register_pass(name="identity_dropout_eliminate", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="remove Dropout in inference mode (its mask unused)")
def identity_dropout_eliminate(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [DropoutRule()])
