"""conv_bn_fuse: a Conv or ConvTranspose followed by BatchNormalization becomes one conv.

    BatchNormalization(Conv(x, W, B), gamma, beta, mean, var)  ->  Conv(x, W * a, (B - mean) * a + beta)
    with a = gamma / sqrt(var + epsilon) per output channel (epsilon from the node, default 1e-5)

Preconditions: the conv weights (and bias) are float constants, not DequantizeLinear outputs (folding would
change quantized weights, a Paddle-Lite complaint); the four statistics are constants with one value per
channel; the BatchNormalization is in inference mode; the conv output feeds only the BatchNormalization.
For ConvTranspose the weights are [C_in, C_out/group, k...], so the factor applies per group along axis 1.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.batchnorm import batchnorm_affine, batchnorm_refusal
from worker.engine.passes.support.weights import (
    conv_bias, CONV_OPS, conv_out_channels, conv_refusal, fused_conv, scale_conv_outputs,
)
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

class ConvBatchNorm(Rule):
    name = "conv_bn"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.op(CONV_OPS, p.var("x"), p.var("w"), key="conv")
        p.BatchNormalization(y, key="bn", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        conv = match.node("conv")
        refusal = conv_refusal(conv)
        if refusal:
            return refusal
        weight = conv.input(1).constant_value()
        channels = conv_out_channels(conv.op_type, weight, conv.attr("group", 1))
        return batchnorm_refusal(match.node("bn"), channels) or True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        conv, bn = match.node("conv"), match.node("bn")
        group = conv.attr("group", 1)
        weight = conv.input(1).constant_value()
        a, b = batchnorm_affine(bn)
        new_weight = scale_conv_outputs(conv.op_type, weight, a, group)
        new_bias = conv_bias(conv, a.size) * a + b
        return fused_conv(match.graph, conv, new_weight, new_bias, match.value("out"), before=bn)


@register_pass(name="conv_bn_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="fold a BatchNormalization into the Conv or ConvTranspose before it")
def conv_bn_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConvBatchNorm()])
