"""pad_conv_fuse: a zero constant Pad on the spatial dims before a Conv becomes the Conv's own padding.

    Conv(Pad(x, pads, mode="constant", value=0), W, B)  ->  Conv(x, W, B, pads = conv pads + spatial pads)

Refused when the Pad is not constant-mode, fills with anything but zero, pads N or C, has negative (cropping)
or non-constant amounts, or when the Conv uses SAME auto-padding. ConvTranspose is not a candidate: its pads
crop the output instead of padding the input.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.ir import Node
from worker.engine.passes.support.padding import PadSpec, merged_pads, pad_refusal, read_pad
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


class PadConv(Rule):
    name = "pad_conv"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Conv(p.Pad(p.var("x"), key="pad"), key="conv", out="out")
        return p

    def _spec(self, ctx: PassContext, match: Match):
        conv = match.node("conv")
        weight = conv.input(1)
        rank = weight.rank if weight is not None and weight.rank else match.value("x").rank
        return None if rank is None else read_pad(match.node("pad"), ctx.opset(), rank)

    def check(self, ctx: PassContext, match: Match) -> PadSpec | str:
        pad, conv, spec = match.node("pad"), match.node("conv"), self._spec(ctx, match)
        refusal = pad_refusal(pad, spec, conv)
        if refusal:
            return refusal
        if spec.value != 0.0:
            return f"{describe(pad)} fills with {spec.value}, and {describe(conv)} pads with zeros"
        return spec

    def rewrite(self, ctx: PassContext, match: Match, spec: PadSpec) -> Node:
        conv = match.node("conv")
        attributes = dict(conv.attributes)
        attributes.pop("auto_pad", None)
        fused = match.graph.add_node("Conv", [match.value("x"), *conv.inputs[1:]], outputs=[match.value("out")],
                                     name=conv.name, attributes=attributes, before=conv)
        fused.set_attr("pads", merged_pads(conv.attr("pads"), spec.spatial()))
        return fused


@register_pass(name="pad_conv_fuse", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="fold a zero constant Pad on the spatial dims into the Conv after it")
def pad_conv_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [PadConv()])
