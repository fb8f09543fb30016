"""fuse_consecutive_reshapes: a Reshape of a view op's output (Reshape, Flatten, Squeeze, Unsqueeze) reads
the view's input directly.

    x -> Reshape(s1) -> t -> Reshape(s2) -> y    becomes    x -> Reshape(s2') -> y    (or x, when y ~ x)

A view never reorders elements, so only the final shape matters. ``s2'`` is the static output shape when type
inference knows it; otherwise ``s2`` with each 0 (copy a dim of ``t``) kept when ``t`` and ``x`` have the same
dim there, or replaced by ``t``'s static dim. The first op goes away once nothing else reads it. Exact.

A Squeeze, Unsqueeze or Flatten of a Reshape's output (read by nothing else) whose shape type inference knows
statically is one Reshape to that shape (TorchScript's MobileNetV4 attention writes k as Reshape(1, 64, -1)
-> Unsqueeze(1), which its dynamo export writes as one Reshape(1, 1, 64, -1)):

    x -> Reshape(s1) -> t -> Unsqueeze(a) -> y:[1, 1, 64, 4]    becomes    x -> Reshape(1, 1, 64, 4) -> y
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import int_list
from worker.engine.passes.support.shapes import same_dim, same_shape, static_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, forward_refusal

VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def resolved_target(second: Node) -> list[int] | str:
    """The second Reshape's target, valid when read against the first op's input."""
    static = static_shape(second.output())
    if static is not None and (0 not in static or second.attr("allowzero", 0)):
        return list(static)
    target = int_list(second.input(1))
    if target is None:
        return "the target shape is not known at optimization time"
    if second.attr("allowzero", 0):
        return target
    middle, source = second.input(0), second.input(0).producer.input(0)
    resolved = []
    for i, wanted in enumerate(target):
        if wanted != 0:
            resolved.append(wanted)
        elif middle.shape is not None and source.shape is not None and i < min(len(middle.shape),
                                                                               len(source.shape)) \
                and same_dim(middle.shape[i], source.shape[i]):
            resolved.append(0)
        elif middle.shape is not None and i < len(middle.shape) and isinstance(middle.shape[i], int):
            resolved.append(middle.shape[i])
        else:
            return f"entry {i} of the target copies a dim that is not known"
    return resolved


class ConsecutiveReshapes(Rule):
    name = "fuse_consecutive_reshapes"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.op(VIEW_OPS, p.var("x"), key="first", out="t").keep()
        p.Reshape(t, p.var("shape"), key="second", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> Value | list[int] | str:
        source, second = match.value("x"), match.node("second")
        target = resolved_target(second)
        if isinstance(target, str):
            return target
        if same_shape(source.shape, match.value("y").shape) and forward_refusal(match, source) is None:
            return source
        return target

    def rewrite(self, ctx: PassContext, match: Match, target: list[int]) -> None:
        second = match.node("second")
        if target != int_list(match.value("shape")):
            shape = match.graph.root.add_initializer(f"{second.name}_shape", np.array(target, dtype=np.int64))
            second.set_input(1, shape)
        second.set_input(0, match.value("x"))


class ViewAfterReshape(Rule):
    name = "fuse_consecutive_reshapes"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name + "_view_after_reshape")
        t = p.Reshape(p.var("x"), p.var("s1"), key="first", out="t")
        p.op(("Flatten", "Squeeze", "Unsqueeze"), t, key="second", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> list[int] | str | None:
        shape = static_shape(match.value("y"))
        if shape is None:
            return None  # the second op's shape follows the input's: nothing static to write
        if 0 in shape:
            return "its output has an empty dim, which a Reshape target would read as a copy"
        return list(shape)

    def rewrite(self, ctx: PassContext, match: Match, target: list[int]) -> Node:
        second = match.node("second")
        shape = match.graph.root.add_initializer(f"{second.name}_shape", np.array(target, dtype=np.int64))
        return match.graph.add_node("Reshape", [match.value("x"), shape], [match.value("y")], name=second.name,
                                    before=second)


@register_pass(name="fuse_consecutive_reshapes", kind=PassKind.PROGRAM, level=1,
               description="a Reshape after Reshape/Flatten/Squeeze/Unsqueeze reads the first op's input; a "
                           "Flatten/Squeeze/Unsqueeze of a static shape after a Reshape is one Reshape")
def fuse_consecutive_reshapes(ctx: PassContext) -> PassResult:
    if ctx.opset() < 5:
        return PassResult()  # Reshape keeps its shape as an attribute before opset 5
    return apply_rules(ctx, [ConsecutiveReshapes(), ViewAfterReshape()])
