"""pad_conv_fuse: a zero constant Pad on the spatial dims before a Conv becomes the Conv's own padding.

    Conv(Pad(x, pads, mode="constant", value=0), W, B)  ->  Conv(x, W, B, pads = conv pads + spatial pads)

Refused when the Pad is not constant-mode, fills with anything but zero, pads N or C, has negative (cropping)
or non-constant amounts, or when the Conv uses SAME auto-padding. ConvTranspose is not a candidate: its pads
crop the output instead of padding the input.
"""
from __future__ import annotations

from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.fuse.padding import merged_pads, read_pad
from worker.passes.fuse.rewrite import FusionRule, describe, graph_of, run_rules
from worker.passes.registry import register_pass
from worker.pattern import Match, Pattern


def pad_refusal(pad, spec, consumer) -> str | None:
    """Refusals every pad fusion shares (the fill value is checked by the caller)."""
    if spec is None:
        return f"the amounts of {describe(pad)} are not constants"
    if spec.mode != "constant":
        return f"{describe(pad)} pads in {spec.mode!r} mode, and {describe(consumer)} can only pad with a constant"
    if spec.touches_batch_or_channels:
        return f"{describe(pad)} pads the batch or channel dim, which {describe(consumer)} cannot"
    if min(spec.begins + spec.ends) < 0:
        return f"{describe(pad)} crops (negative pads)"
    if consumer.attr("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID"):
        return f"{describe(consumer)} uses SAME auto-padding"
    return None


class PadConv(FusionRule):
    name = "pad_conv"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.var("t")
        p.op("pad", "Pad", inputs=[p.var("x")], outputs=[t])
        p.op("conv", "Conv", inputs=[t], outputs=[p.var("out")])
        return p

    def _spec(self, ctx: PassContext, match: Match):
        conv = match.node("conv")
        weight = conv.input(1)
        rank = weight.rank if weight is not None and weight.rank else match.value("x").rank
        return None if rank is None else read_pad(match.node("pad"), ctx.opset(), rank)

    def check(self, ctx: PassContext, match: Match) -> str | None:
        pad, conv, spec = match.node("pad"), match.node("conv"), self._spec(ctx, match)
        refusal = pad_refusal(pad, spec, conv)
        if refusal:
            return refusal
        if spec.value != 0.0:
            return f"{describe(pad)} fills with {spec.value}, and {describe(conv)} pads with zeros"
        return None

    def rewrite(self, ctx: PassContext, match: Match):
        pad, conv, spec = match.node("pad"), match.node("conv"), self._spec(ctx, match)
        attributes = dict(conv.attributes)
        attributes.pop("auto_pad", None)
        fused = graph_of(match).add_node("Conv", [match.value("x"), *conv.inputs[1:]], outputs=[match.value("out")],
                                         name=conv.name, attributes=attributes, before=conv)
        fused.set_attr("pads", merged_pads(conv.attr("pads"), spec.spatial()))
        self.orphan(*pad.inputs[1:])
        return fused


@register_pass(name="pad_conv_fuse", kind=PassKind.PROGRAM, level=1,
               description="fold a zero constant Pad on the spatial dims into the Conv after it")
def pad_conv_fuse(ctx: PassContext) -> PassResult:
    return run_rules(ctx, [PadConv()])
