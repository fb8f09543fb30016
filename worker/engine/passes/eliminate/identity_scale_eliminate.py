"""identity_scale_eliminate: multiplying or dividing by one, adding or subtracting zero, is removed; so is
the boolean And with true and Or with false.

    x -> Mul(x, 1) -> y    becomes    x        (also 1 * x, x / 1, x + 0, 0 + x, x - 0, And(x, true), Or(x, false))

(Paddle-Lite's identity_scale_eliminate and elementwise_mul_constant_eliminate.) The constant must be all
ones (or zeros), of the input's element type, and broadcast into the input's shape without enlarging it, so
the output has the input's shape. Exact up to the sign of zero (-0 + 0 is +0). The transformers library's
masks start from a tensor of true (``torch.ones(..., dtype=bool)``) and And every condition into it, which
TorchScript keeps as a constant once folded.

    x:[.., m, 1] -> MatMul(x, ones[.., 1, 1]) -> y    becomes    x    (also MatMul(ones[.., 1, 1], x:[.., 1, n]))

A matrix product by a 1x1 matrix of one (what an attention over a single token keeps of its weights once
eliminate_unit_softmax made them constant): each element of x times one. Preconditions as for Mul: the ones
of x's element type, and y known to have x's shape (the ones' batch dims enlarge nothing).
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.arrays import is_uniform
from worker.engine.passes.support.shapes import same_dim, same_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

#: op -> its neutral element (the data may be either operand of Mul, Add, And and Or, only the first of Div
#: and Sub).
NEUTRAL = {"Mul": 1, "Add": 0, "Div": 1, "Sub": 0, "And": True, "Or": False}


def is_all(data: np.ndarray, neutral: int) -> bool:
    if data.size == 0:
        return False
    if is_uniform(data):
        return bool(np.asarray(data[(0,) * data.ndim]) == neutral)
    return bool(np.all(data == neutral))


def broadcasts_into(constant: np.ndarray, value: Value, out: Value) -> bool:
    """``value`` op ``constant`` has the shape of ``value``."""
    if same_shape(value.shape, out.shape) or constant.ndim == 0:
        return True
    shape = value.shape
    if shape is None or constant.ndim > len(shape):
        return False
    tail = shape[len(shape) - constant.ndim:]
    return all(c == 1 or same_dim(c, d) for c, d in zip(constant.shape, tail))


class IdentityScaleRule(Rule):
    """x op c -> x, for the ops of ``NEUTRAL`` whose constant c is all their neutral element."""

    pattern_args = ("ops", "commutative")

    def __init__(self, ops: tuple[str, ...], commutative: bool):
        super().__init__()
        self.ops, self.commutative = ops, commutative
        self.name = "identity_scale_eliminate"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(self.ops, p.var("x"), p.var("c").const(), key="op", out="y", commutative=self.commutative)
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        data, other = match.value("x"), match.value("c")
        constant = other.constant_value()
        if not is_all(constant, NEUTRAL[match.node("op").op_type]):
            return None
        if data.dtype != other.dtype:
            return "the constant has another element type than the data"
        if not broadcasts_into(constant, data, match.value("y")):
            return "the constant broadcasts the data to a larger shape"
        return data


class MatMulByOneRule(Rule):
    """MatMul(x, c) or MatMul(c, x) -> x, c a constant [.., 1, 1] of ones."""

    name = "identity_scale_eliminate"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.MatMul(p.var("x"), p.var("c").const(), out="y", commutative=True)
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        data, other, out = match.value("x"), match.value("c"), match.value("y")
        constant = other.constant_value()
        if constant.ndim < 2 or constant.shape[-2:] != (1, 1) or not is_all(constant, 1):
            return None
        if data.dtype != other.dtype:
            return "the constant has another element type than the data"
        if not same_shape(data.shape, out.shape):
            return "the product is not known to have the data's shape"
        return data


@register_pass(name="identity_scale_eliminate", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="remove multiply/divide by one (a MatMul by a 1x1 one too), add/subtract zero, "
                           "And with true and Or with false")
def identity_scale_eliminate(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [IdentityScaleRule(("Mul", "Add", "And", "Or"), commutative=True),
                             IdentityScaleRule(("Div", "Sub"), commutative=False), MatMulByOneRule()])
