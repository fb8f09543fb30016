"""eliminate_if_with_const_cond: an If whose condition is known at optimization time is replaced by the
nodes of the branch it takes.

    If(cond=true, then={a = Relu(x)}, else={...}) -> y    becomes    a = Relu(x), readers of y read a

The branch's nodes move into the If's graph in order, before the If, keeping their names (names are unique
model-wide); its initializers move to the main graph. Each If output is then bypassed by the branch output,
or, when that is impossible (the If output is a graph output and the branch output comes from an outer
scope), produced by an Identity of it. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Graph, Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.constants import hoist_initializer
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class IfWithConstantCondition(Rule):
    name = "eliminate_if_with_const_cond"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.If(p.var("cond").const(), key="if", outputs=0)  # every output is the rewrite's business
        return p

    def check(self, ctx: PassContext, match: Match) -> Graph | None:
        """The branch the If takes (None, not a refusal, for a condition of several elements)."""
        condition = match.value("cond").constant_value()
        if condition.size != 1:
            return None
        return match.node("if").attr("then_branch" if bool(np.asarray(condition).reshape(-1)[0]) else "else_branch")

    def rewrite(self, ctx: PassContext, match: Match, branch: Graph) -> list[Node]:
        """Move the branch into the If's graph in place of the If; returns the nodes now standing in for it."""
        graph, node = match.graph, match.node("if")
        results = list(branch.outputs)
        branch.set_outputs([])
        for value in list(branch.initializers.values()):
            hoist_initializer(value, graph.root)
        moved = list(branch)
        for inner in moved:
            graph.move_before(inner, node)
        for out, result in zip(node.outputs, results):
            if not out.is_used:
                continue
            if graph.bypass_refusal(out, result) is None:
                graph.bypass(out, result)
            else:
                moved.append(graph.add_node("Identity", [result], [out], name=f"{node.name}_{out.name}", before=node))
        return moved


@register_pass(name="eliminate_if_with_const_cond", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="replace an If whose condition is constant by the nodes of the branch it takes")
def eliminate_if_with_const_cond(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [IfWithConstantCondition()])
