"""layer_norm_fuse: LayerNormalization written out as reductions becomes the LayerNormalization op (opset 17+).

    d = x - ReduceMean(x, axes)                      (axes: the trailing dims, keepdims=1)
    y = d / Sqrt(ReduceMean(d ^ 2, axes) [+ eps])    (d ^ 2 as Pow(d, 2) or Mul(d, d))
        [* gamma] [+ beta]                          ->  LayerNormalization(x, gamma, beta, axis, epsilon=eps)

A chain without the epsilon is the op with epsilon 0 (I-BERT's float layer norm adds its 1e-12 in Python,
which the dynamo exporter drops): the same division by the root of the variance.

The exporters of older frameworks (and torch before opset 17) emit this chain; onnxruntime basic fuses it too.
Refused before opset 17, when the two reductions differ or do not cover a trailing block of dims, when eps
or the exponent are not constants, and when gamma or beta vary along a dim that is not normalized.
gamma and beta become constants of exactly the normalized shape (ones when there is no gamma).
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.normalization import affine_constant, normalized_axes, scalar, trailing_axis
from worker.engine.passes.support.weights import FLOAT_TYPES, numpy_dtype
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

AFFINE = ("full", "scale", "none")


class LayerNormChain(Rule):
    pattern_args = ("square", "affine", "has_eps")

    def __init__(self, square: str, affine: str, has_eps: bool = True):
        super().__init__()
        self.square, self.affine, self.has_eps = square, affine, has_eps
        self.name = f"layer_norm_{square}_{affine}{'' if has_eps else '_without_eps'}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x = p.var("x")
        d = p.Sub(x, p.ReduceMean(x, key="mean_op"), key="sub")
        square = p.Pow(d, p.var("two"), key="square_op") if self.square == "pow" else p.Mul(d, d, key="square_op")
        variance = p.ReduceMean(square, key="var_op")
        if self.has_eps:
            variance = p.Add(variance, p.var("eps"), key="add_eps", commutative=True)
        std = p.Sqrt(variance, key="sqrt")
        if self.affine == "none":
            p.Div(d, std, key="div", out="out")
            return p
        scaled = p.Mul(p.Div(d, std, key="div"), p.var("gamma"), key="scale", commutative=True,
                       out="out" if self.affine == "scale" else None)
        if self.affine == "full":
            p.Add(scaled, p.var("beta"), key="shift", out="out", commutative=True)
        return p

    def _axis(self, ctx: PassContext, match: Match) -> int | None:
        x = match.value("x")
        if not x.is_static or x.dtype not in FLOAT_TYPES:
            return None
        rank = len(x.shape)
        axes = normalized_axes(match.node("mean_op"), ctx.opset(), rank)
        if axes is None or axes != normalized_axes(match.node("var_op"), ctx.opset(), rank):
            return None
        return trailing_axis(axes, rank)

    def check(self, ctx: PassContext, match: Match) -> int | str:
        """The first normalized axis, or why the chain is not a LayerNormalization."""
        if ctx.opset() < 17:
            return f"LayerNormalization needs opset 17, and the model imports opset {ctx.opset()}"
        axis = self._axis(ctx, match)
        if axis is None:
            return (f"the reductions {describe(match.node('mean_op'))} and {describe(match.node('var_op'))} do not "
                    f"both average a trailing block of dims of a float tensor of known shape with keepdims")
        if self.square == "pow" and scalar(match.value("two")) != 2.0:
            return f"{describe(match.node('square_op'))} does not square (its exponent is not the constant 2)"
        if self.has_eps and scalar(match.value("eps")) is None:
            eps = match.value("eps").name
            return f"the epsilon {eps!r} added by {describe(match.node('add_eps'))} is not a constant"
        for key in ("gamma", "beta"):
            if key in match and affine_constant(match.value(key), match.value("x").shape, axis) is None:
                return (f"the {key} {match.value(key).name!r} is not a constant that varies only along the "
                        f"normalized dims")
        return axis

    def rewrite(self, ctx: PassContext, match: Match, axis: int) -> Node:
        x, graph = match.value("x"), match.graph
        dtype = numpy_dtype(x.dtype)
        if "gamma" in match:
            gamma = affine_constant(match.value("gamma"), x.shape, axis).astype(dtype)
        else:
            gamma = np.ones(x.shape[axis:], dtype)
        inputs = [x, graph.add_initializer(f"{match.node('div').name}_scale", gamma)]
        if "beta" in match:
            beta = affine_constant(match.value("beta"), x.shape, axis).astype(dtype)
            inputs.append(graph.add_initializer(f"{match.node('div').name}_bias", beta))
        return graph.add_node("LayerNormalization", inputs, outputs=[match.value("out")],
                              name=match.node("div").name, before=match.node("div"),
                              attributes={"axis": axis,
                                          "epsilon": scalar(match.value("eps")) if self.has_eps else 0.0})


@register_pass(name="layer_norm_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn LayerNormalization written out as ReduceMean/Sub/Pow/Sqrt/Div into the op "
                           "(opset 17+)")
def layer_norm_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [LayerNormChain(square, affine, has_eps) for has_eps in (True, False)
                             for affine in AFFINE for square in ("pow", "mul")])
