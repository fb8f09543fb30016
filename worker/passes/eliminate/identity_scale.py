"""identity_scale_eliminate: multiplying or dividing by one, adding or subtracting zero, is removed.

    x -> Mul(x, 1) -> y    becomes    x        (also 1 * x, x / 1, x + 0, 0 + x, x - 0)

(Paddle-Lite's identity_scale_eliminate and elementwise_mul_constant_eliminate.) The constant must be all
ones (or zeros), of the input's element type, and broadcast into the input's shape without enlarging it, so
the output has the input's shape. Exact up to the sign of zero (-0 + 0 is +0).
"""
from __future__ import annotations

import numpy as np

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import is_uniform, same_dim, same_shape
from worker.passes.eliminate.forward import ForwardRule, apply_forward_rules
from worker.passes.registry import register_pass

#: op -> (neutral element, input slots the data may take).
NEUTRAL = {"Mul": (1, (0, 1)), "Add": (0, (0, 1)), "Div": (1, (0,)), "Sub": (0, (0,))}


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


class IdentityScaleRule(ForwardRule):
    name = "identity_scale_eliminate"
    op_types = tuple(NEUTRAL)

    def forward(self, ctx: PassContext, node: Node) -> Value | str | None:
        neutral, data_slots = NEUTRAL[node.op_type]
        for slot in data_slots:
            data, other = node.input(slot), node.input(1 - slot)
            constant = other.constant_value() if other is not None else None
            if constant is None or data is None or not is_all(constant, neutral):
                continue
            if data.dtype != other.dtype:
                return "the constant has another element type than the data"
            if not broadcasts_into(constant, data, node.output()):
                return "the constant broadcasts the data to a larger shape"
            return data
        return None


@register_pass(name="identity_scale_eliminate", kind=PassKind.PROGRAM, level=1,
               description="remove multiply/divide by one and add/subtract zero")
def identity_scale_eliminate(ctx: PassContext) -> PassResult:
    return apply_forward_rules(ctx, [IdentityScaleRule()])
