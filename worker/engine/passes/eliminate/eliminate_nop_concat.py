"""eliminate_nop_concat: a Concat of one tensor (the others empty along the axis) is removed.

    x -> Concat(x) -> y    becomes    x
    Concat(x, e:[N,0]) -> y    becomes    x    (e statically empty along the axis)

Exact. The empty inputs must have a static zero along the axis.
"""
from __future__ import annotations

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


def _is_empty_along(value: Value, axis: int) -> bool:
    if value.shape is None or not value.shape:
        return False
    return value.shape[axis % len(value.shape)] == 0


class NopConcatRule(Rule):
    name = "eliminate_nop_concat"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Concat(key="concat", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | None:
        node = match.node("concat")
        inputs = [v for v in node.inputs if v is not None]
        if len(inputs) == 1:
            return inputs[0]
        axis = node.attr("axis", 0)
        kept = [v for v in inputs if not _is_empty_along(v, axis)]
        if len(kept) == 1 and kept[0].shape is not None and len(kept[0].shape) == len(match.value("y").shape or ()):
            return kept[0]
        return None


@register_pass(name="eliminate_nop_concat", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Concat of a single (non-empty) input")
def eliminate_nop_concat(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopConcatRule()])
