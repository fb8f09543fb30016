"""elementwise_activation_fuse: an Add (or a two-input Sum) and the activation after it become one
mirserve.FusedAdd<Act> (Paddle-Lite's elementwise_activation_fuse).

    Add(A, B) or Sum(A, B) -> act       =>  mirserve.FusedAdd<Act>(A, B)

The activation forms, preconditions and numeric effect are those of ``support/activation_fusion.py``.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.activation_fusion import activation_rules
from worker.engine.pattern import apply_rules


@register_pass(name="elementwise_activation_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Add (or a two-input Sum) followed by an activation -> mirserve.FusedAdd<Act>")
def elementwise_activation_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, activation_rules({"Add": ("Add", "Sum")}))
