"""conv_activation_fuse: a Conv or ConvTranspose and the activation after it become one
mirserve.FusedConv<Act> / FusedConvTranspose<Act> (Paddle-Lite's conv_activation_fuse, ncnn's
fuse_convolution_activation).

    Conv(X, W[, B]) -> act              =>  mirserve.FusedConv<Act>(X, W, B or zeros)
    ConvTranspose(X, W[, B]) -> act     =>  mirserve.FusedConvTranspose<Act>(X, W, B or zeros)

The activation forms, preconditions and numeric effect are those of ``support/activation_fusion.py``.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.activation_fusion import activation_rules
from worker.engine.pattern import apply_rules


@register_pass(name="conv_activation_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Conv / ConvTranspose followed by an activation -> mirserve.FusedConv<Act> / "
                           "FusedConvTranspose<Act>")
def conv_activation_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, activation_rules({"Conv": ("Conv",), "ConvTranspose": ("ConvTranspose",)}))
