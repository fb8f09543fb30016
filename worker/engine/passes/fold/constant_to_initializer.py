"""constant_to_initializer: a Constant node becomes an initializer of the main graph, under the same name.

    Constant(value=t) -> c -> readers    becomes    initializer c = t -> readers

Initializers are what runtimes pre-pack and what every later pass reads as a weight; a Constant inside a
Loop body would otherwise run on every iteration. Names are unique model-wide, so a body's Constant moves to
the main graph and its readers see it from the outer scope. Refused for a Constant that is itself a graph
output (it must stay produced by a node) and for string or sparse values. Exact.
"""
from __future__ import annotations

import numpy as np

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.constants import replace_with_constant
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class ConstantToInitializer(Rule):
    name = "constant_to_initializer"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Constant(key="constant", out="c")
        return p

    def check(self, ctx: PassContext, match: Match) -> np.ndarray | str:
        out = match.value("c")
        if out.is_graph_output:
            return f"its output {out.name!r} is a graph output"
        data = match.node("constant").constant_output()
        return "it holds a sparse or string value" if data is None else data

    def rewrite(self, ctx: PassContext, match: Match, data: np.ndarray) -> None:
        initializer = replace_with_constant(match.graph, match.value("c"), data)
        initializer.doc_string = match.node("constant").doc_string


@register_pass(name="constant_to_initializer", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="turn Constant nodes into initializers of the main graph, names kept")
def constant_to_initializer(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ConstantToInitializer()])
