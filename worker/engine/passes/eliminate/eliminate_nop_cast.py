"""eliminate_nop_cast: a Cast (or CastLike) to the element type its input already has is removed.

    x:float -> Cast(to=float) -> y    becomes    x

Needs the input's element type from type inference. Exact.
"""
from __future__ import annotations

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class NopCastRule(Rule):
    name = "eliminate_nop_cast"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(("Cast", "CastLike"), p.var("x"), key="cast")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        node, source = match.node("cast"), match.value("x")
        if not source.dtype:
            return "the element type of its input is not known"
        if node.op_type == "Cast":
            target = node.attr("to")
        else:
            like = node.input(1)
            target = like.dtype if like is not None else 0
        if target != source.dtype:
            return None  # a real conversion
        return source


@register_pass(name="eliminate_nop_cast", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Cast/CastLike to the element type the input already has")
def eliminate_nop_cast(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopCastRule()])
