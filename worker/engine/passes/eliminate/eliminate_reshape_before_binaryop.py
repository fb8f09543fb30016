"""eliminate_reshape_before_binaryop: a Reshape (or Flatten/Squeeze/Unsqueeze) that only adds or removes
leading unit axes before an elementwise binary op is skipped; broadcasting does the same.

    b:[C] -> Reshape([1, 1, C]) -> r:[1,1,C] -> Add(x:[N,H,C], r)    becomes    Add(x, b)

(ncnn's eliminate_reshape_before_binaryop.) Broadcasting aligns shapes from the right and pads with leading
ones, so the op sees the same values, provided the two shapes are equal once leading ones are stripped and
the other operand's rank keeps the output's rank. The view op is removed once nothing reads it. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.shapes import same_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
              "GreaterOrEqual", "And", "Or", "Xor", "BitShift")
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _strip_leading_ones(shape) -> tuple:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


class ReshapeBeforeBinaryOp(Rule):
    name = "eliminate_reshape_before_binaryop"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        r = p.op(VIEW_OPS, p.var("x"), key="view", out="r").keep()
        p.op(BINARY_OPS, r, p.var("other"), key="binary", commutative=True, when=has_two_inputs)
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | None:
        """The binary op gives the same result reading the view's input; None otherwise (no refusal)."""
        source, view_out, other = match.value("x"), match.value("r"), match.value("other")
        if other is view_out or source.shape is None or view_out.shape is None or other.shape is None:
            return None
        if not same_shape(_strip_leading_ones(source.shape), _strip_leading_ones(view_out.shape)):
            return None
        if max(other.rank, source.rank) != max(other.rank, view_out.rank):
            return None
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> None:
        binary = match.node("binary")
        binary.set_input(binary.inputs.index(match.value("r")), match.value("x"))


def has_two_inputs(node: Node) -> bool:
    """has two inputs"""
    return len(node.inputs) == 2


@register_pass(name="eliminate_reshape_before_binaryop", peer="ncnn", kind=PassKind.PROGRAM, level=1,
               description="skip a Reshape/Unsqueeze before an elementwise binary op that only changes "
                           "leading unit axes")
def eliminate_reshape_before_binaryop(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ReshapeBeforeBinaryOp()])
