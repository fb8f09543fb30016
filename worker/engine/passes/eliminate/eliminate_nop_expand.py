"""eliminate_nop_expand: an Expand that broadcasts to the shape its input already has is removed.

    x:[N,3,8] -> Expand([1, 1]) -> y:[N,3,8]    becomes    x

Either type inference knows both shapes and they are equal, or the constant target shape is all ones and no
longer than the input's rank (which broadcasts to the input's own shape). Exact.
"""
from __future__ import annotations

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import int_list
from worker.engine.passes.support.shapes import same_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class NopExpandRule(Rule):
    name = "eliminate_nop_expand"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Expand(p.var("x"), p.var("shape"), out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        source, out = match.value("x"), match.value("y")
        if same_shape(source.shape, out.shape):
            return source
        target = int_list(match.value("shape"))
        if target is not None and source.rank is not None and len(target) <= source.rank \
                and all(t == 1 for t in target):
            return source
        if source.is_static and out.is_static:
            return None  # a real broadcast
        return "the shapes are not known to be equal"


@register_pass(name="eliminate_nop_expand", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Expand to the shape the input already has")
def eliminate_nop_expand(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopExpandRule()])
