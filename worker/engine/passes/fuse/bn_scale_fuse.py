"""bn_scale_fuse: a per-channel constant Mul, Div, Add or Sub after BatchNormalization goes into its scale and
bias (ncnn's fuse_batchnorm_scale; the exporters' "BN then affine" of Caffe's Scale layer).

    Mul(BN(x, gamma, beta, mean, var), s)  ->  BN(x, gamma * s, beta * s, mean, var)
    Add(BN(x, gamma, beta, mean, var), c)  ->  BN(x, gamma, beta + c, mean, var)

gamma and beta must be constants, the constant must hold one value per channel (axis 1) or a single value;
the mean, variance and epsilon are kept as they are. A chain Mul -> Add folds in one run.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.weights import cast_like, channel_vector, f64, factor_refusal, fused_name
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


class BatchNormAffine(Rule):
    pattern_args = ("op",)

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.name = f"bn_{op.lower()}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.BatchNormalization(p.var("x"), key="bn", out="y")
        p.op(self.op, y, p.var("c").const(), key="affine", out="out", commutative=self.op in ("Add", "Mul"))
        return p

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str:
        """The per-channel vector of the constant, or why it cannot go into the BatchNormalization."""
        bn = match.node("bn")
        if bn.attr("training_mode", 0) or bn.attr("spatial", 1) == 0:
            return f"{describe(bn)} is in training mode or has per-activation statistics"
        for slot, name in ((1, "scale"), (2, "bias")):
            value = bn.input(slot)
            if value.constant_value() is None:
                return f"the {name} of {describe(bn)} ({value.name!r}) is not a constant"
        vector = self._vector(match)
        if vector is None:
            c = match.value("c")
            return (f"the constant {c.name!r} after {describe(bn)} has shape {list(c.constant_value().shape)}, "
                    f"not one value per channel, or the rank of the BatchNormalization output is unknown")
        if self.op == "Div" and not np.all(vector):
            return f"the divisor {match.value('c').name!r} after {describe(bn)} has zeros"
        if self.op in ("Mul", "Div"):
            factor = vector if self.op == "Mul" else 1.0 / vector
            refusal = factor_refusal(factor, match.value("c").name,
                                     [bn.input(1).constant_value(), bn.input(2).constant_value()])
            if refusal:
                return refusal
        return vector

    def rewrite(self, ctx: PassContext, match: Match, vector: np.ndarray) -> Node:
        bn, graph = match.node("bn"), match.graph
        scale_value, bias_value = bn.input(1), bn.input(2)
        scale, bias = f64(scale_value.constant_value()), f64(bias_value.constant_value())
        if self.op in ("Mul", "Div"):
            factor = vector if self.op == "Mul" else 1.0 / vector
            scale_value = graph.add_initializer(fused_name(scale_value.name),
                                                cast_like(scale * factor, scale_value.constant_value()))
            bias = bias * factor
        else:
            bias = bias + vector if self.op == "Add" else bias - vector
        bias_value = graph.add_initializer(fused_name(bias_value.name), cast_like(bias, bias_value.constant_value()))
        return graph.add_node("BatchNormalization", [bn.input(0), scale_value, bias_value, *bn.inputs[3:]],
                              outputs=[match.value("out")], name=bn.name, attributes=dict(bn.attributes),
                              before=match.node("affine"))

    def _vector(self, match: Match) -> np.ndarray | None:
        rank = match.value("y").rank or match.value("x").rank
        if rank is None or rank < 2:
            return None
        channels = match.node("bn").input(1).constant_value().size
        return channel_vector(match.value("c").constant_value(), rank, channels)


@register_pass(name="bn_scale_fuse", peer="ncnn", kind=PassKind.PROGRAM, level=1,
               description="fold a per-channel constant Mul, Div, Add or Sub after a BatchNormalization into it")
def bn_scale_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [BatchNormAffine(op) for op in ("Mul", "Div", "Add", "Sub")])
