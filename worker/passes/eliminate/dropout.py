"""identity_dropout_eliminate: Dropout in inference mode is the identity (NNVM SimplifyInference).

    x -> Dropout -> y (, mask unused)    becomes    x

Opset 12 on: only when the ``training_mode`` input is absent or a constant false. Before opset 7: only when
``is_test`` is set (its default is training). Refused when the mask output is used. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass


class DropoutRule(ForwardRule):
    name = "identity_dropout_eliminate"
    op_types = ("Dropout",)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
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
        return node.input(0)


@register_pass(name="identity_dropout_eliminate", kind=PassKind.PROGRAM, level=1,
               description="remove Dropout in inference mode (its mask unused)")
def identity_dropout_eliminate(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [DropoutRule()])
