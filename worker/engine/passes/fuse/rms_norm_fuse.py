"""rms_norm_fuse: RMSNorm written out as reductions becomes the RMSNormalization op (opset 23+).

    r = Sqrt(ReduceMean(x ^ 2, axes) + eps)       (axes: the trailing dims, keepdims=1; x ^ 2 as Pow(x, 2)
                                                   or Mul(x, x))
    y = x * Reciprocal(r)  |  x * (1 / r)  |  x / r
        [* gamma]                              ->  RMSNormalization(x, gamma, axis, epsilon=eps)

Llama, Mistral, Qwen2 and T5 write their RMSNorm so: the dynamo exporter spells rsqrt as Reciprocal(Sqrt),
TorchScript as Div(1, Sqrt); the casts to float32 and back around it are no-ops on float32 models and are
gone by the time this pass runs (eliminate_nop_cast). Refused before opset 23 (``--target-opset 23`` raises
it), where no valid place has a RMSNormalization kernel, when the reduction does not average a trailing
block of dims of a float tensor whose normalized dims are known, when eps, the exponent or the one are not
the constants they must be, and when gamma varies along a dim that is not normalized. gamma becomes a
constant of exactly the normalized shape (ones when there is none). Numeric effect: the op computes in
float32 (its stash_type) in one kernel; the result differs from the chain's in the last bits.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.normalization import affine_constant, normalized_axes, scalar, trailing_axis
from worker.engine.passes.support.standard_ops import standard_op_refusal
from worker.engine.passes.support.weights import FLOAT_TYPES, numpy_dtype
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

#: The three spellings of x / r: times Reciprocal(r), times Div(1, r), and Div(x, r).
INVERSES = ("reciprocal", "div_one", "div")


class RMSNormChain(Rule):
    def __init__(self, square: str, inverse: str, has_scale: bool):
        super().__init__()
        self.square, self.inverse, self.has_scale = square, inverse, has_scale
        self.name = f"rms_norm_{square}_{inverse}_{'scale' if has_scale else 'none'}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x = p.var("x")
        square = p.Pow(x, p.var("two"), key="square_op") if self.square == "pow" else p.Mul(x, x, key="square_op")
        mean_square = p.Add(p.ReduceMean(square, key="mean_op"), p.var("eps"), key="add_eps", commutative=True)
        root = p.Sqrt(mean_square, key="sqrt")
        last = None if self.has_scale else "out"
        if self.inverse == "div":
            normalized = p.Div(x, root, key="normalize", out=last)
        else:
            inverse = p.Reciprocal(root, key="inverse") if self.inverse == "reciprocal" else \
                p.Div(p.var("one"), root, key="inverse")
            normalized = p.Mul(x, inverse, key="normalize", commutative=True, out=last)
        if self.has_scale:
            p.Mul(normalized, p.var("gamma"), key="scale", commutative=True, out="out")
        return p

    def _axis(self, ctx: PassContext, match: Match) -> int | None:
        x = match.value("x")
        if x.shape is None or x.dtype not in FLOAT_TYPES:
            return None
        rank = len(x.shape)
        axis = trailing_axis(normalized_axes(match.node("mean_op"), ctx.opset(), rank), rank)
        if axis is None or not all(isinstance(d, int) for d in x.shape[axis:]):
            return None
        return axis

    def check(self, ctx: PassContext, match: Match) -> int | str:
        """The first normalized axis, or why the chain is not an RMSNormalization."""
        refusal = standard_op_refusal(ctx, "RMSNormalization", 23)
        if refusal:
            return refusal
        axis = self._axis(ctx, match)
        if axis is None:
            return (f"{describe(match.node('mean_op'))} does not average a trailing block of dims of a float "
                    f"tensor whose normalized dims are known, with keepdims")
        if self.square == "pow" and scalar(match.value("two")) != 2.0:
            return f"{describe(match.node('square_op'))} does not square (its exponent is not the constant 2)"
        if self.inverse == "div_one" and scalar(match.value("one")) != 1.0:
            return f"{describe(match.node('inverse'))} does not invert (its dividend is not the constant 1)"
        if scalar(match.value("eps")) is None:
            return (f"the epsilon {match.value('eps').name!r} added by {describe(match.node('add_eps'))} is not a "
                    f"constant")
        if self.has_scale and affine_constant(match.value("gamma"), match.value("x").shape, axis) is None:
            return (f"the scale {match.value('gamma').name!r} is not a constant that varies only along the "
                    f"normalized dims")
        return axis

    def rewrite(self, ctx: PassContext, match: Match, axis: int) -> Node:
        x, graph, anchor = match.value("x"), match.graph, match.node("normalize")
        dtype = numpy_dtype(x.dtype)
        if self.has_scale:
            gamma = affine_constant(match.value("gamma"), x.shape, axis).astype(dtype)
        else:
            gamma = np.ones(x.shape[axis:], dtype)
        scale = graph.add_initializer(f"{anchor.name}_scale", gamma)
        return graph.add_node("RMSNormalization", [x, scale], outputs=[match.value("out")], name=anchor.name,
                              before=anchor, attributes={"axis": axis, "epsilon": scalar(match.value("eps"))})


@register_pass(name="rms_norm_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn RMSNorm written out as Pow/ReduceMean/Add/Sqrt/Div or Reciprocal/Mul into "
                           "RMSNormalization (opset 23+)")
def rms_norm_fuse(ctx: PassContext) -> PassResult:
    # With a scale first, so the chain's last Mul goes into the op rather than staying behind it.
    return apply_rules(ctx, [RMSNormChain(square, inverse, has_scale) for has_scale in (True, False)
                             for inverse in INVERSES for square in ("pow", "mul")])
