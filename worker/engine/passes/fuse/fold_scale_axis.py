"""fold_scale_axis: a per-channel constant Mul (or Add, where exact) next to a Conv, Gemm or MatMul is folded
into its weights (NNVM's FoldScaleAxis, forward and backward, for the scale and for the shift).

    Conv(Mul(x, s), W)              ->  Conv(x, W * s[c_in])                  (ConvTranspose too; Div by 1/s)
    Gemm(Mul(A, s), B, C)           ->  Gemm(A, B * s[k], C)                  (MatMul with constant 2-D B too)
    Conv(Add(x, b), W, B)           ->  Conv(x, W, B + sum_{c,k} W * b[c])    (only without padding: a padded
                                                                               border sees zeros, not b)
    Gemm(Add(A, b), B, C)           ->  Gemm(A, B, beta * C + alpha * b @ B, beta=1)
    Mul(Gemm(A, B, C), s)           ->  Gemm(A, B * s[n], C * s)              (MatMul with constant B too)
    Conv(Add(Mul(x, s), b), W)      ->  Conv(Add(x, b / s), W * s[c_in])      (a padded Conv: the shift stays,
                                                                               moved before the scale)

s and b hold one value per channel of the axis they meet (input channels of a conv, K of a Gemm, the last
axis of a MatMul) or a single value; anything else is refused with its shape. A Mul after a Conv is
conv_scale_fuse's. Weights must be float constants, not DequantizeLinear outputs. A scalar factor may also
travel along ops that commute with scaling to reach such weights (``scale_paths``).
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.scale_paths import TravellingScale
from worker.engine.passes.support.weights import (
    cast_like, channel_vector, constant_refusal, conv_in_channels, conv_of_constant, conv_refusal, f64,
    factor_refusal, fused_name, scale_conv_inputs,
)
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

LINEAR = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def input_axis(node, x_rank: int | None) -> tuple[int, int, int] | None:
    """(rank, channels, axis) of the axis of ``node``'s data input that its weights contract."""
    weight = node.input(1).constant_value()
    if node.op_type in ("Conv", "ConvTranspose"):
        return weight.ndim, conv_in_channels(node.op_type, weight, node.attr("group", 1)), 1
    if weight.ndim != 2 or x_rank is None or x_rank < 2:
        return None
    if node.op_type == "Gemm":
        k = weight.shape[1] if node.attr("transB", 0) else weight.shape[0]
        return 2, k, 0 if node.attr("transA", 0) else 1
    return x_rank, weight.shape[0], x_rank - 1


def scale_rows(node, weight: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Weights with the contracted axis K (rows of a Gemm/MatMul B) scaled by s."""
    if node.op_type in ("Conv", "ConvTranspose"):
        return scale_conv_inputs(node.op_type, weight, s, node.attr("group", 1))
    return f64(weight) * (s[None, :] if node.op_type == "Gemm" and node.attr("transB", 0) else s[:, None])


def scale_columns(node, weight: np.ndarray, s: np.ndarray) -> np.ndarray:
    return f64(weight) * (s[:, None] if node.op_type == "Gemm" and node.attr("transB", 0) else s[None, :])


class _Fold(Rule):
    """Shared check and rebuild: ``node`` is the linear op whose weights absorb the constant ``k``."""

    def linear(self, match: Match):
        return match.node("linear")

    def vector(self, match: Match) -> np.ndarray | None:
        raise NotImplementedError

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str:
        """The constant as one value per channel of the axis it meets, or why it cannot be folded."""
        node = self.linear(match)
        if node.op_type in ("Conv", "ConvTranspose"):
            refusal = conv_refusal(node)
        else:
            refusal = constant_refusal(node, 1, "weights")
            if refusal is None and node.input(2) is not None:
                refusal = constant_refusal(node, 2, "bias")
        if refusal:
            return refusal
        before, after = (match.value("x"), match.value("t")) if "t" in match else (match.value("y"), match.value("out"))
        if before.shape is None or before.shape != after.shape:
            return (f"the constant {match.value('k').name!r} next to {describe(node)} changes the shape "
                    f"{before.shape} to {after.shape} by broadcasting, or the shapes are unknown")
        vector = self.vector(match)
        if vector is None:
            k = match.value("k")
            return (f"the constant {k.name!r} next to {describe(node)} has shape {list(k.constant_value().shape)}, "
                    f"not one value per channel of the axis the weights contract, or the shapes are unknown")
        if self.op == "Div" and not np.all(vector):
            return f"the divisor {match.value('k').name!r} has zeros"
        with np.errstate(divide="ignore"):
            factor = 1.0 / vector if self.op == "Div" else vector
        scaled = [v.constant_value() for v in node.inputs[1:] if v is not None]
        return factor_refusal(factor, match.value("k").name, scaled if self.op in ("Mul", "Div") else ()) or vector

    def rebuild(self, match: Match, data, weight: np.ndarray | None = None, bias: np.ndarray | None = None, *,
                beta_one: bool = False) -> Node:
        """The linear op again, reading ``data``; ``weight``/``bias`` are new arrays, or None to keep its own."""
        node, graph = self.linear(match), match.graph
        like = node.input(1).constant_value()
        inputs = [data, node.input(1) if weight is None else
                  graph.add_initializer(fused_name(node.input(1).name), cast_like(weight, like))]
        if bias is not None:
            inputs.append(graph.add_initializer(fused_name(f"{node.name}_bias"), cast_like(bias, like)))
        elif node.input(2) is not None:
            inputs.append(node.input(2))
        new = graph.add_node(node.op_type, inputs, outputs=[match.value("out")], name=node.name,
                             attributes=dict(node.attributes), before=node)
        if beta_one:
            new.set_attr("beta", 1.0)
        return new


class _BeforeLinear(_Fold):
    """``op`` (x, constant k) read by one of ``linear_ops``: the constant meets the axis its weights contract."""

    pattern_args = ("op", "linear_ops", "key", "commutative_op")
    linear_ops: tuple[str, ...] = LINEAR
    #: The pattern key of the constant's node, and the op of the two it may take that commutes.
    key, commutative_op = "scale", "Mul"

    def __init__(self, op: str):
        super().__init__()
        self.op, self.name = op, f"{op.lower()}_before_linear"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.op(self.op, p.var("x"), p.var("k").const(), key=self.key, out="t",
                 commutative=self.op == self.commutative_op)
        p.op(self.linear_ops, t, key="linear", out="out")
        return p

    def input_channel_vector(self, match: Match, name: str) -> np.ndarray | None:
        """The constant ``name`` as one value per channel of the axis the linear op contracts, or None."""
        found = input_axis(self.linear(match), match.value("x").rank)
        return None if found is None else channel_vector(match.value(name).constant_value(), *found)


class ScaleBefore(_BeforeLinear):
    """Mul/Div of the data input by a per-input-channel constant -> scaled weights."""

    def vector(self, match: Match) -> np.ndarray | None:
        found = input_axis(self.linear(match), match.value("x").rank)
        if found is None:
            return None
        vector = channel_vector(match.value("k").constant_value(), *found)
        return None if vector is None or match.value("x").rank not in (None, found[0]) else vector

    def rewrite(self, ctx: PassContext, match: Match, vector: np.ndarray) -> Node:
        node = self.linear(match)
        factor = vector if self.op == "Mul" else 1.0 / vector
        return self.rebuild(match, match.value("x"), scale_rows(node, node.input(1).constant_value(), factor))


class ShiftBefore(_BeforeLinear):
    """Add/Sub of a per-input-channel constant before an unpadded Conv or a Gemm -> a changed bias."""

    linear_ops = ("Conv", "Gemm")
    key, commutative_op = "shift", "Add"

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str:
        node = self.linear(match)
        if node.op_type == "Conv" and (any(node.attr("pads", ())) or
                                       node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID")):
            return f"{describe(node)} pads its input, and its border would see zeros instead of the shifted values"
        return super().check(ctx, match)

    def vector(self, match: Match) -> np.ndarray | None:
        return self.input_channel_vector(match, "k")

    def rewrite(self, ctx: PassContext, match: Match, shift: np.ndarray) -> Node:
        node = self.linear(match)
        shift = shift if self.op == "Add" else -shift
        weight = node.input(1).constant_value()
        old_bias = None if node.input(2) is None else f64(node.input(2).constant_value())
        if node.op_type == "Conv":
            added = conv_of_constant(weight, shift, node.attr("group", 1))
            return self.rebuild(match, match.value("x"), bias=added if old_bias is None else old_bias + added)
        effective = f64(weight).T if node.attr("transB", 0) else f64(weight)
        added = float(node.attr("alpha", 1.0)) * (shift @ effective)
        bias = added if old_bias is None else float(node.attr("beta", 1.0)) * old_bias + added
        return self.rebuild(match, match.value("x"), bias=bias, beta_one=True)


class ScaleShiftBefore(ScaleBefore):
    """Mul then Add before a conv that pads: x * s + b == (x + b / s) * s, so the Mul still reaches the conv's
    weights and only an Add stays (three nodes become two)."""

    def __init__(self):
        super().__init__("Mul")
        self.name = "mul_add_before_padded_conv"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.Mul(p.var("x"), p.var("k").const(), key="scale", out="t", commutative=True)
        u = p.Add(t, p.var("b").const(), key="shift", out="u", commutative=True)
        p.op(("Conv", "ConvTranspose"), u, key="linear", out="out")
        return p

    def shift(self, match: Match) -> np.ndarray | None:
        return self.input_channel_vector(match, "b")

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str:
        scale = super().check(ctx, match)
        if isinstance(scale, str):
            return scale
        if self.shift(match) is None or match.value("u").shape != match.value("t").shape:
            return f"the constant {match.value('b').name!r} is not one value per input channel"
        if not np.all(scale):
            return f"the scale {match.value('k').name!r} has zeros, so the shift cannot move before it"
        return factor_refusal(self.shift(match) / scale, match.value("b").name) or scale

    def rewrite(self, ctx: PassContext, match: Match, scale: np.ndarray) -> list[Node]:
        node, x, graph = self.linear(match), match.value("x"), match.graph
        shape = (scale.size,) + (1,) * (x.rank - 2)
        like = match.value("b").constant_value()
        offset = graph.add_initializer(f"{match.value('b').name}_moved", cast_like((self.shift(match) / scale)
                                                                                  .reshape(shape), like))
        shifted = graph.make_value(f"{x.name}_shifted", x.dtype, x.shape)
        moved = graph.add_node("Add", [x, offset], outputs=[shifted], name=match.node("shift").name, before=node)
        weight = scale_rows(node, node.input(1).constant_value(), scale)
        return [moved, self.rebuild(match, moved.output(), weight)]


class ScaleAfter(_Fold):
    """Mul/Div of a Gemm's or MatMul's output by a per-column constant -> scaled weights (and C)."""

    pattern_args = ("op",)

    def __init__(self, op: str):
        super().__init__()
        self.op, self.name = op, f"linear_{op.lower()}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.op(("Gemm", "MatMul"), p.var("x"), key="linear", out="y")
        p.op(self.op, y, p.var("k").const(), key="scale", out="out", commutative=self.op == "Mul")
        return p

    def vector(self, match: Match) -> np.ndarray | None:
        node, rank = self.linear(match), match.value("y").rank
        weight = node.input(1).constant_value()
        if weight.ndim != 2 or rank is None or rank < 2:
            return None
        columns = weight.shape[0] if node.op_type == "Gemm" and node.attr("transB", 0) else weight.shape[1]
        return channel_vector(match.value("k").constant_value(), rank, columns, axis=rank - 1)

    def rewrite(self, ctx: PassContext, match: Match, vector: np.ndarray) -> Node:
        node = self.linear(match)
        factor = vector if self.op == "Mul" else 1.0 / vector
        bias = None if node.input(2) is None else f64(node.input(2).constant_value()) * factor
        weight = scale_columns(node, node.input(1).constant_value(), factor)
        return self.rebuild(match, match.value("x"), weight, bias)


@register_pass(name="fold_scale_axis", peer="NNVM", kind=PassKind.PROGRAM, level=1,
               description="fold a per-channel Mul or Add next to a Conv, Gemm or MatMul into its weights")
def fold_scale_axis(ctx: PassContext) -> PassResult:
    rules = [ScaleBefore("Mul"), ScaleBefore("Div"), ShiftBefore("Add"), ShiftBefore("Sub"), ScaleShiftBefore(),
             ScaleAfter("Mul"), ScaleAfter("Div")]
    rules += [TravellingScale(op, direction) for direction in ("backward", "forward") for op in ("Mul", "Div")]
    return apply_rules(ctx, rules)
