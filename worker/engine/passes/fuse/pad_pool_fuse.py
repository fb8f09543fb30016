"""pad_pool_fuse: a constant Pad on the spatial dims before AveragePool or MaxPool becomes the pool's padding.

    AveragePool(Pad(x, pads, value=0))     ->  AveragePool(x, pads = pool pads + pads, count_include_pad=1)
    MaxPool(Pad(x, pads, value=-inf))      ->  MaxPool(x, pads = pool pads + pads)

An AveragePool counts explicitly padded zeros in its divisor, so the fused pool must count its pads too: that
is impossible when the pool already has pads of its own that it does not count (count_include_pad=0). A
MaxPool pads with -inf, so a zero Pad cannot fold into it. ceil_mode pools are refused: their last window may
start inside the padding, where explicit and implicit pads differ.
"""
from __future__ import annotations

import math

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.ir import Node
from worker.engine.passes.support.padding import PadSpec, merged_pads, pad_refusal, read_pad
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


class PadPool(Rule):
    name = "pad_pool"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(("AveragePool", "MaxPool"), p.Pad(p.var("x"), key="pad"), key="pool", out="out")
        return p

    def _spec(self, ctx: PassContext, match: Match):
        rank = len(match.node("pool").attr("kernel_shape", ())) + 2
        return read_pad(match.node("pad"), ctx.opset(), rank)

    def check(self, ctx: PassContext, match: Match) -> PadSpec | str:
        pad, pool, spec = match.node("pad"), match.node("pool"), self._spec(ctx, match)
        refusal = pad_refusal(pad, spec, pool)
        if refusal:
            return refusal
        if pool.attr("ceil_mode", 0):
            return f"{describe(pool)} uses ceil_mode, whose last window may start inside the padding"
        if pool.op_type == "MaxPool":
            if spec.value is None or not (math.isinf(spec.value) and spec.value < 0):
                return f"{describe(pad)} fills with {spec.value}, and {describe(pool)} pads with -inf"
            return spec
        if spec.value != 0.0:
            return f"{describe(pad)} fills with {spec.value}, and {describe(pool)} pads with zeros"
        if any(pool.attr("pads", ())) and not pool.attr("count_include_pad", 0):
            return (f"{describe(pool)} has pads of its own that it leaves out of the average "
                    f"(count_include_pad=0), while the padded zeros count")
        return spec

    def rewrite(self, ctx: PassContext, match: Match, spec: PadSpec) -> Node:
        pool = match.node("pool")
        attributes = dict(pool.attributes)
        attributes.pop("auto_pad", None)
        fused = match.graph.add_node(pool.op_type, [match.value("x")], outputs=[match.value("out")],
                                     name=pool.name, attributes=attributes, before=pool)
        fused.set_attr("pads", merged_pads(pool.attr("pads"), spec.spatial()))
        if pool.op_type == "AveragePool":
            fused.set_attr("count_include_pad", 1)
        return fused


@register_pass(name="pad_pool_fuse", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="fold a constant Pad on the spatial dims into the AveragePool or MaxPool after it")
def pad_pool_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [PadPool()])
