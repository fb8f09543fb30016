"""eliminate_nop_reshape: a Reshape (or Flatten, Squeeze, Unsqueeze) to the shape its input has is removed.

    x:[N,256] -> Reshape([0, 256]) -> y:[N,256]    becomes    x

Either type inference knows both shapes and they are equal dim by dim (symbolic dims by name), or the
constant target shape says so: every entry copies (0, without allowzero) or repeats the input's dim, with at
most one -1 standing for the one dim left. Exact: a view op does not touch the data.
"""
from __future__ import annotations

from worker.engine.ir import Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import int_list
from worker.engine.passes.support.shapes import same_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


def target_keeps_shape(target: list[int], shape, allowzero: bool) -> bool:
    """A Reshape target that reproduces ``shape`` whatever its symbolic dims are."""
    if shape is None or len(target) != len(shape):
        return False
    wildcards = 0
    for wanted, dim in zip(target, shape):
        if wanted == 0 and not allowzero:
            continue
        if wanted == -1:
            wildcards += 1
            continue
        if not (isinstance(dim, int) and dim == wanted):
            return False
    has_zero = any(isinstance(d, int) and d == 0 for d in shape)
    return wildcards == 0 or (wildcards == 1 and not has_zero)


class NopReshapeRule(Rule):
    name = "eliminate_nop_reshape"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), p.var("x"), key="view", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | str | None:
        node, source, out = match.node("view"), match.value("x"), match.value("y")
        if same_shape(source.shape, out.shape):
            return source
        if node.op_type == "Reshape" and ctx.opset() >= 5:
            target = int_list(node.input(1))
            if target is not None and target_keeps_shape(target, source.shape, bool(node.attr("allowzero", 0))):
                return source
        if source.is_static and out.is_static:
            return None  # a real reshape
        return "the shapes are not known to be equal"


@register_pass(name="eliminate_nop_reshape", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="remove Reshape/Flatten/Squeeze/Unsqueeze to the shape the input already has")
def eliminate_nop_reshape(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [NopReshapeRule()])
