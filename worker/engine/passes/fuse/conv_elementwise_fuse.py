"""conv_elementwise_fuse: a per-channel constant added to (or subtracted from) a conv's output becomes its bias.

    Add(Conv(x, W, B), c)  ->  Conv(x, W, B + c)        Sub(Conv(x, W, B), c)  ->  Conv(x, W, B - c)

Applies to Conv and ConvTranspose. c must hold one value per output channel (shape [C], [C,1,1], [1,C,1,1]) or
a single value; a full-tensor add or one broadcast over H or W is refused. Paddle-Lite runs this fusion
before and after conv_bn_fuse; the fixed point here does the same.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.conv_affine import ConvAffine
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import apply_rules


@register_pass(name="conv_elementwise_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="fold a per-channel constant Add or Sub after a Conv or ConvTranspose into its bias")
def conv_elementwise_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConvAffine("Add"), ConvAffine("Sub")])
