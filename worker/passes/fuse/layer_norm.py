"""layer_norm_fuse: LayerNormalization written out as reductions becomes the LayerNormalization op (opset 17+).

    d = x - ReduceMean(x, axes)                      (axes: the trailing dims, keepdims=1)
    y = d / Sqrt(ReduceMean(d ^ 2, axes) + eps)      (d ^ 2 as Pow(d, 2) or Mul(d, d))
        [* gamma] [+ beta]                          ->  LayerNormalization(x, gamma, beta, axis, epsilon=eps)

The exporters of older frameworks (and torch before opset 17) emit this chain; onnxruntime basic fuses it too.
Refused before opset 17, when the two reductions differ or do not cover a trailing block of dims, when eps
or the exponent are not constants, and when gamma or beta vary along a dim that is not normalized.
gamma and beta become constants of exactly the normalized shape (ones when there is no gamma).
"""
from __future__ import annotations

import numpy as np

from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import axes_of
from worker.passes.fuse.rewrite import FusionRule, describe, graph_of, run_rules
from worker.passes.fuse.weights import FLOAT_TYPES, numpy_dtype
from worker.passes.registry import register_pass
from worker.pattern import Match, Pattern

AFFINE = ("full", "scale", "none")


def scalar(value) -> float | None:
    data = None if value is None else value.constant_value()
    return None if data is None or data.size != 1 else float(np.reshape(data, -1)[0])


def normalized_axes(reduce, opset: int, rank: int) -> list[int] | None:
    """The dims a ReduceMean averages over, normalized; None when not known or keepdims is off."""
    if not reduce.attr("keepdims", 1):
        return None
    axes = axes_of(reduce, opset)
    if axes is None:
        if reduce.attr("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(a % rank for a in axes)


def affine_constant(value, x_shape, axis: int) -> np.ndarray | None:
    """gamma/beta broadcast to exactly the normalized shape; None when they vary along other dims."""
    data = value.constant_value()
    rank = len(x_shape)
    if data is None or data.ndim > rank:
        return None
    aligned = data.reshape((1,) * (rank - data.ndim) + data.shape)
    if any(d != 1 for d in aligned.shape[:axis]):
        return None
    try:
        return np.broadcast_to(aligned.reshape(aligned.shape[axis:]), tuple(x_shape[axis:])).copy()
    except ValueError:
        return None


class LayerNormChain(FusionRule):
    def __init__(self, square: str, affine: str):
        super().__init__()
        self.square, self.affine = square, affine
        self.name = f"layer_norm_{square}_{affine}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x, mean, d, sq, var, ve, std = (p.var(k) for k in ("x", "mean", "d", "sq", "var", "ve", "std"))
        p.op("mean_op", "ReduceMean", inputs=[x], outputs=[mean])
        p.op("sub", "Sub", inputs=[x, mean], outputs=[d])
        if self.square == "pow":
            p.op("square_op", "Pow", inputs=[d, p.var("two")], outputs=[sq])
        else:
            p.op("square_op", "Mul", inputs=[d, d], outputs=[sq])
        p.op("var_op", "ReduceMean", inputs=[sq], outputs=[var])
        p.op("add_eps", "Add", inputs=[var, p.var("eps")], outputs=[ve], commutative=True)
        p.op("sqrt", "Sqrt", inputs=[ve], outputs=[std])
        if self.affine == "none":
            p.op("div", "Div", inputs=[d, std], outputs=[p.var("out")])
            return p
        n = p.var("n")
        p.op("div", "Div", inputs=[d, std], outputs=[n])
        if self.affine == "scale":
            p.op("scale", "Mul", inputs=[n, p.var("gamma")], outputs=[p.var("out")], commutative=True)
            return p
        y = p.var("y")
        p.op("scale", "Mul", inputs=[n, p.var("gamma")], outputs=[y], commutative=True)
        p.op("shift", "Add", inputs=[y, p.var("beta")], outputs=[p.var("out")], commutative=True)
        return p

    def _axis(self, ctx: PassContext, match: Match) -> int | None:
        x = match.value("x")
        if not x.is_static or x.dtype not in FLOAT_TYPES:
            return None
        rank = len(x.shape)
        axes = normalized_axes(match.node("mean_op"), ctx.opset(), rank)
        if axes is None or axes != normalized_axes(match.node("var_op"), ctx.opset(), rank):
            return None
        return axes[0] if axes == list(range(axes[0], rank)) else None

    def check(self, ctx: PassContext, match: Match) -> str | None:
        if ctx.opset() < 17:
            return f"LayerNormalization needs opset 17, and the model imports opset {ctx.opset()}"
        axis = self._axis(ctx, match)
        if axis is None:
            return (f"the reductions {describe(match.node('mean_op'))} and {describe(match.node('var_op'))} do not "
                    f"both average a trailing block of dims of a float tensor of known shape with keepdims")
        if self.square == "pow" and scalar(match.value("two")) != 2.0:
            return f"{describe(match.node('square_op'))} does not square (its exponent is not the constant 2)"
        if scalar(match.value("eps")) is None:
            eps = match.value("eps").name
            return f"the epsilon {eps!r} added by {describe(match.node('add_eps'))} is not a constant"
        for key in ("gamma", "beta"):
            if key in match and affine_constant(match.value(key), match.value("x").shape, axis) is None:
                return (f"the {key} {match.value(key).name!r} is not a constant that varies only along the "
                        f"normalized dims")
        return None

    def rewrite(self, ctx: PassContext, match: Match):
        x, graph = match.value("x"), graph_of(match)
        axis = self._axis(ctx, match)
        dtype = numpy_dtype(x.dtype)
        if "gamma" in match:
            gamma = affine_constant(match.value("gamma"), x.shape, axis).astype(dtype)
        else:
            gamma = np.ones(x.shape[axis:], dtype)
        inputs = [x, graph.add_initializer(f"{match.node('div').name}_scale", gamma)]
        if "beta" in match:
            beta = affine_constant(match.value("beta"), x.shape, axis).astype(dtype)
            inputs.append(graph.add_initializer(f"{match.node('div').name}_bias", beta))
        self.orphan(*(match.value(k) for k in ("two", "eps", "gamma", "beta") if k in match))
        self.orphan(*match.node("mean_op").inputs[1:], *match.node("var_op").inputs[1:])
        return graph.add_node("LayerNormalization", inputs, outputs=[match.value("out")],
                              name=match.node("div").name, before=match.node("div"),
                              attributes={"axis": axis, "epsilon": scalar(match.value("eps"))})


@register_pass(name="layer_norm_fuse", kind=PassKind.PROGRAM, level=1,
               description="turn LayerNormalization written out as ReduceMean/Sub/Pow/Sqrt/Div into the op "
                           "(opset 17+)")
def layer_norm_fuse(ctx: PassContext) -> PassResult:
    return run_rules(ctx, [LayerNormChain(square, affine) for affine in AFFINE for square in ("pow", "mul")])
