"""adaptive_pool_global_replace: an AveragePool or MaxPool whose kernel covers its whole input becomes global
pooling (Paddle-Lite's adaptive_1x1_pool2d_convert_global: adaptive pooling to 1x1 exported as a plain pool).

    AveragePool(x, kernel_shape = x.shape[2:], no pads)  ->  GlobalAveragePool(x)
    MaxPool(x, kernel_shape = x.shape[2:], no pads)      ->  GlobalMaxPool(x)

Candidates are pools whose kernel equals the input's static spatial dims; refused when the pool pads (its
output is then larger than 1x1) or dilates. A MaxPool whose Indices output is used is not a candidate.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.placement import placement_refusal, planned_facts
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

GLOBAL = {"AveragePool": "GlobalAveragePool", "MaxPool": "GlobalMaxPool"}


def covers_input(node: Node) -> bool:
    """has a kernel that covers the input"""
    x = node.input(0)
    kernel = list(node.attr("kernel_shape", ()))
    return x is not None and x.is_static and len(x.shape) == len(kernel) + 2 and list(x.shape[2:]) == kernel


class WholeInputPool(Rule):
    name = "whole_input_pool"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(tuple(GLOBAL), p.var("x"), key="pool", out="out", when=covers_input)
        return p

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        pool = match.node("pool")
        if any(pool.attr("pads", ())) or pool.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return f"{describe(pool)} pads its input, so its output is larger than 1x1"
        if any(d != 1 for d in pool.attr("dilations", ())):
            return f"{describe(pool)} dilates its kernel"
        facts = planned_facts(GLOBAL[pool.op_type], "", ctx.opset(""), [match.value("x")], [match.value("out")],
                              {}, pool.name)
        return placement_refusal(ctx, facts, match.nodes) or True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        pool = match.node("pool")
        return match.graph.add_node(GLOBAL[pool.op_type], [match.value("x")], outputs=[match.value("out")],
                                    name=pool.name, before=pool)


@register_pass(name="adaptive_pool_global_replace", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=2,
               description="replace an AveragePool or MaxPool whose kernel covers its whole input by global pooling")
def adaptive_pool_global_replace(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [WholeInputPool()])
