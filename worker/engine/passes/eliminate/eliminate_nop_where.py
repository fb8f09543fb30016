"""eliminate_nop_where: a Where whose condition is a constant of one truth value is the operand it picks, where
that operand already has the output's shape.

    Where(c = [False, False, False, False], ones, s) -> y    becomes    s

The TorchScript exporter writes ``x.expand(b, 1, s, s)`` as ``Expand(x, Where(Equal(v, -1), 1, v))`` (a -1
keeps the input's dim); once eliminate_shape_op knows that no element of v is -1 (they are dims, or other
constants), the condition folds to all false and the Where is v itself, which onnx's inference reads through:
the Expand's output gets v's dims (batch, sequence) instead of four made-up ones, and so does every attention
its mask feeds. The picked operand must have the output's shape (no broadcast by the condition or the other
operand). Exact.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.shapes import same_shape, static_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class NopWhereRule(Rule):
    name = "eliminate_nop_where"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Where(p.var("condition"), p.var("x"), p.var("y"), out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        condition = match.value("condition").constant_value()
        if condition is None or condition.size == 0:
            return None  # a select decided at run time
        if condition.all():
            picked, other = match.value("x"), match.value("y")
        elif not condition.any():
            picked, other = match.value("y"), match.value("x")
        else:
            return None  # picks from both: a constant select, not a nop
        out = match.value("out")
        if same_shape(picked.shape, out.shape):
            return picked
        shapes = [static_shape(picked), static_shape(other), condition.shape]
        if None not in shapes and _broadcast(shapes) == shapes[0]:
            return picked
        return "the condition or the other operand may broadcast the picked one to a larger shape"


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:  # shapes that do not broadcast: the runtime refuses the model, not this pass
        return None


@register_pass(name="eliminate_nop_where", kind=PassKind.PROGRAM, level=1,
               description="remove Where with a constant all-true or all-false condition")
def eliminate_nop_where(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopWhereRule()])
