"""eliminate_unit_softmax: a Softmax over a single element is a tensor of ones, which constant folding and the
eliminations then carry on (a MatMul by those ones is its other operand, the scores go unused).

    s:[1, 1, 1] -> Softmax(axis=-1) -> w    becomes    w = ones([1, 1, 1]) (initializer)
    LogSoftmax -> zeros,  Hardmax -> ones

An attention over one token (a late stage of a small image: timm's efficientvit_m0 at 64x64 attends over
1x1 positions) normalizes each score over itself. The reduced part is axis ``axis`` from opset 13, and
every axis from ``axis`` on before it (the input is read as 2-D); it must be known to hold one element.
Preconditions: the output's shape is static and holds at most ``MAX_ELEMENTS`` elements (the ones become a
weight), a floating-point type, and the output is no graph output (it must stay produced by a node).
Exact for finite scores; a NaN or infinite score gave NaN, which the constant no longer does.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.constants import replace_with_constant
from worker.engine.passes.support.shapes import static_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

#: What each op gives over a single element.
RESULT = {"Softmax": 1.0, "Hardmax": 1.0, "LogSoftmax": 0.0}
#: Largest output replaced by a weight.
MAX_ELEMENTS = 1 << 16


def reduced_elements(shape: tuple[int, ...], axis: int, opset: int) -> int:
    """How many elements each normalization runs over."""
    return shape[axis] if opset >= 13 else math.prod(shape[axis:])


class UnitSoftmaxRule(Rule):
    name = "eliminate_unit_softmax"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(tuple(RESULT), p.var("x"), key="softmax", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str | None:
        node, out = match.node("softmax"), match.value("y")
        opset = ctx.opset("")
        shape = static_shape(match.value("x"))
        if shape is None or not shape:
            return None  # nothing known to be a single element
        axis = node.attr("axis", -1 if opset >= 13 else 1)
        axis = axis + len(shape) if axis < 0 else axis
        if not 0 <= axis < len(shape) or reduced_elements(shape, axis, opset) != 1:
            return None
        if out.is_graph_output:
            return f"its output {out.name!r} is a graph output"
        if not out.dtype or not np.issubdtype(helper.tensor_dtype_to_np_dtype(out.dtype), np.floating):
            return "its output's element type is not a known floating-point type"
        if math.prod(shape) > MAX_ELEMENTS:
            return f"its output holds {math.prod(shape)} elements, more than {MAX_ELEMENTS} to store as a weight"
        return np.full(shape, RESULT[node.op_type], dtype=helper.tensor_dtype_to_np_dtype(out.dtype))

    def rewrite(self, ctx: PassContext, match: Match, data: np.ndarray) -> None:
        replace_with_constant(match.graph, match.value("y"), data)


@register_pass(name="eliminate_unit_softmax", kind=PassKind.PROGRAM, level=1,
               description="a Softmax / LogSoftmax / Hardmax over a single element becomes its constant result")
def eliminate_unit_softmax(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [UnitSoftmaxRule()])
