"""conv_scale_fuse: a per-channel constant multiplying (or dividing) a conv's output goes into its weights.

    Mul(Conv(x, W, B), s)  ->  Conv(x, W * s[c], B * s)       Div(Conv(x, W, B), s)  ->  Conv(x, W / s[c], B / s)

Applies to Conv and ConvTranspose (whose weights are [C_in, C_out/group, k...]). s must hold one value per
output channel or a single value; anything varying along N, H or W is refused, and so is a divisor with zeros.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.conv_affine import ConvAffine
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import apply_rules


@register_pass(name="conv_scale_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="fold a per-channel constant Mul or Div after a Conv or ConvTranspose into its weights")
def conv_scale_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConvAffine("Mul"), ConvAffine("Div")])
