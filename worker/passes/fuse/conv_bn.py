"""conv_bn_fuse: a Conv or ConvTranspose followed by BatchNormalization becomes one conv.

    BatchNormalization(Conv(x, W, B), gamma, beta, mean, var)  ->  Conv(x, W * a, (B - mean) * a + beta)
    with a = gamma / sqrt(var + epsilon) per output channel (epsilon from the node, default 1e-5)

Preconditions: the conv weights (and bias) are float constants, not DequantizeLinear outputs (folding would
change quantized weights, a Paddle-Lite complaint); the four statistics are constants with one value per
channel; the BatchNormalization is in inference mode; the conv output feeds only the BatchNormalization.
For ConvTranspose the weights are [C_in, C_out/group, k...], so the factor applies per group along axis 1.
"""
from __future__ import annotations

from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.fuse.rewrite import FusionRule, conv_bias, conv_refusal, describe, fused_conv, graph_of, run_rules
from worker.passes.fuse.weights import CONV_OPS, batchnorm_factors, conv_out_channels, scale_conv_outputs
from worker.passes.registry import register_pass
from worker.pattern import Match, Pattern

STATISTICS = ("scale", "B", "input_mean", "input_var")


def batchnorm_refusal(bn, channels: int) -> str | None:
    """Why a BatchNormalization cannot be folded into something before it (None when it can)."""
    if bn.attr("training_mode", 0):
        return f"{describe(bn)} is in training mode"
    if bn.attr("spatial", 1) == 0:
        return f"{describe(bn)} has per-activation statistics (spatial=0)"
    for slot, name in enumerate(STATISTICS, start=1):
        value = bn.input(slot)
        data = None if value is None else value.constant_value()
        if data is None:
            return f"the BatchNormalization statistics of {describe(bn)} ({name}) are not constants"
        if data.size != channels or data.ndim != 1:
            return (f"the {name} of {describe(bn)} has shape {list(data.shape)}, "
                    f"not one value per channel ({channels})")
    return None


def batchnorm_affine(bn):
    """(a, b) with BatchNormalization(x) == x * a + b per channel, in float64."""
    stats = [bn.input(slot).constant_value() for slot in range(1, 5)]
    return batchnorm_factors(*stats, bn.attr("epsilon", 1e-5))


class ConvBatchNorm(FusionRule):
    name = "conv_bn"

    def build_pattern(self) -> Pattern:
        p = Pattern("conv_bn")
        y = p.var("y")
        p.op("conv", CONV_OPS, inputs=[p.var("x"), p.var("w")], outputs=[y])
        p.op("bn", "BatchNormalization", inputs=[y], outputs=[p.var("out")])
        return p

    def check(self, ctx: PassContext, match: Match) -> str | None:
        conv = match.node("conv")
        refusal = conv_refusal(conv)
        if refusal:
            return refusal
        weight = conv.input(1).constant_value()
        channels = conv_out_channels(conv.op_type, weight, conv.attr("group", 1))
        return batchnorm_refusal(match.node("bn"), channels)

    def rewrite(self, ctx: PassContext, match: Match):
        conv, bn = match.node("conv"), match.node("bn")
        group = conv.attr("group", 1)
        weight = conv.input(1).constant_value()
        a, b = batchnorm_affine(bn)
        new_weight = scale_conv_outputs(conv.op_type, weight, a, group)
        new_bias = conv_bias(conv, a.size) * a + b
        self.orphan(*conv.inputs[1:], *bn.inputs[1:])
        return fused_conv(graph_of(match), conv, new_weight, new_bias, match.value("out"), before=bn)


@register_pass(name="conv_bn_fuse", kind=PassKind.PROGRAM, level=1,
               description="fold a BatchNormalization into the Conv or ConvTranspose before it")
def conv_bn_fuse(ctx: PassContext) -> PassResult:
    return run_rules(ctx, [ConvBatchNorm()])
