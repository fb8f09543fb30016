"""eliminate_nop_transpose: a Transpose whose permutation keeps every axis in place is removed.

    x -> Transpose(perm=[0, 1, 2]) -> y                    becomes    x
    x:[1, 48, 1, 1] -> Transpose(perm=[0, 1, 3, 2]) -> y    becomes    x    (it moves only axes of extent 1)

A permutation that moves only axes whose static extent is 1 leaves the shape and the order of the elements as
they were (an attention over a single token transposes its [1, 1, 1] weights). Without ``perm`` a Transpose
reverses the axes, which is the identity only for rank 0 or 1. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class NopTransposeRule(Rule):
    name = "eliminate_nop_transpose"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Transpose(p.var("x"), key="transpose")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        source, perm = match.value("x"), match.node("transpose").attr("perm")
        if perm is None:  # reverses the axes: the identity only up to rank 1
            if source.rank is None:
                return "the rank of its input is not known"
            return source if source.rank <= 1 else None
        moved = [axis for position, axis in enumerate(perm) if axis != position]
        if not moved:
            return source
        shape = source.shape
        if shape is not None and len(shape) == len(perm) and all(shape[axis] == 1 for axis in moved):
            return source
        return None


@register_pass(name="eliminate_nop_transpose", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Transpose with the identity permutation (or one moving only axes of extent 1)")
def eliminate_nop_transpose(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopTransposeRule()])
