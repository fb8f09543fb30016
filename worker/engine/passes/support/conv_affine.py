"""The rule behind conv_elementwise_fuse and conv_scale_fuse: a per-channel constant applied to a conv's output
is folded into its bias (Add, Sub) or into its weights and bias (Mul, Div).

A constant that varies along N, H or W (a full-tensor add, a bias broadcast over H) cannot become a bias, and
neither can one that would enlarge the output by broadcasting; both are refused with their shape.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext
from worker.engine.passes.support.weights import (
    CONV_OPS, channel_vector, conv_bias, conv_out_channels, conv_refusal, factor_refusal, fused_conv,
    scale_conv_outputs,
)
from worker.engine.pattern import Match, Pattern, Rule, describe

VERBS = {"Add": "added to", "Sub": "subtracted from", "Mul": "multiplying", "Div": "dividing"}


class ConvAffine(Rule):
    """conv(x) <op> c -> conv'(x), for op in Add, Sub, Mul, Div with c a per-output-channel constant."""

    pattern_args = ("op",)

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.name = f"conv_{op.lower()}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.op(CONV_OPS, p.var("x"), p.var("w"), key="conv")
        p.op(self.op, y, p.var("c").const(), key="affine", out="out", commutative=self.op in ("Add", "Mul"))
        return p

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str:
        """The per-output-channel vector of the constant, or why there is none."""
        conv = match.node("conv")
        refusal = conv_refusal(conv)
        if refusal:
            return refusal
        vector = self._vector(match)
        if vector is None:
            c = match.value("c")
            channels = self._channels(conv)
            return (f"the constant {c.name!r} {VERBS[self.op]} the output of {describe(conv)} has shape "
                    f"{list(c.constant_value().shape)}, not one value per output channel ({channels})")
        if self.op == "Div" and not np.all(vector):
            return f"the divisor {match.value('c').name!r} of the output of {describe(conv)} has zeros"
        if self.op in ("Mul", "Div"):
            factor = vector if self.op == "Mul" else 1.0 / vector
            refusal = factor_refusal(factor, match.value("c").name,
                                     [v.constant_value() for v in conv.inputs[1:] if v is not None])
            if refusal:
                return refusal
        return vector

    def rewrite(self, ctx: PassContext, match: Match, vector: np.ndarray) -> Node:
        conv, weight = match.node("conv"), None
        bias = conv_bias(conv, vector.size)
        if self.op in ("Add", "Sub"):
            bias = bias + vector if self.op == "Add" else bias - vector
        else:
            factor = vector if self.op == "Mul" else 1.0 / vector
            weight = scale_conv_outputs(conv.op_type, conv.input(1).constant_value(), factor, conv.attr("group", 1))
            bias = bias * factor
        return fused_conv(match.graph, conv, weight, bias, match.value("out"), before=match.node("affine"))

    @staticmethod
    def _channels(conv) -> int:
        return conv_out_channels(conv.op_type, conv.input(1).constant_value(), conv.attr("group", 1))

    def _vector(self, match: Match) -> np.ndarray | None:
        conv = match.node("conv")
        rank = conv.input(1).constant_value().ndim
        return channel_vector(match.value("c").constant_value(), rank, self._channels(conv))
