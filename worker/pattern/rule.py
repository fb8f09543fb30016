"""Rewrite rules: pattern -> check -> rewrite, applied to every graph of a model, bodies included.

A check that refuses returns a sentence saying why, which the trace counts, so a user can see why a fusion did
*not* happen. A rewrite builds the replacement (usually producing the pattern's output values itself, see
``Graph.add_node``) and returns the new nodes; the matched ops are then removed in one batch per graph.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from worker.ir import Graph, Node
from worker.pattern.matcher import Match, Matcher
from worker.pattern.pattern import Pattern

if TYPE_CHECKING:
    from worker.passes.base import PassContext, PassResult


class Rule:
    """Subclass and define ``build_pattern``, ``check`` (optional) and ``rewrite``."""

    name = "rule"

    def __init__(self) -> None:
        self._matcher: Matcher | None = None

    @property
    def matcher(self) -> Matcher:
        if self._matcher is None:
            self._matcher = Matcher(self.build_pattern())
        return self._matcher

    def build_pattern(self) -> Pattern:
        raise NotImplementedError

    def check(self, ctx: "PassContext", match: Match) -> str | None:
        """None to accept the match, or a sentence saying why it is refused."""
        return None

    def rewrite(self, ctx: "PassContext", match: Match) -> Node | Sequence[Node] | None:
        raise NotImplementedError


def apply_rules(ctx: "PassContext", rules: Iterable[Rule], result: "PassResult | None" = None) -> "PassResult":
    """Apply each rule to every graph once (the manager's fixed-point groups repeat passes)."""
    from worker.passes.base import PassResult

    result = result or PassResult()
    rules = list(rules)
    for graph in list(ctx.graph.all_graphs()):
        if graph is not ctx.graph and (graph.parent is None or graph.parent.graph is None):
            continue  # the body of a node an earlier rewrite removed
        for rule in rules:
            _apply_rule(ctx, graph, rule, result)
    return result


def _apply_rule(ctx: "PassContext", graph: Graph, rule: Rule, result: "PassResult") -> None:
    doomed: list[Node] = []
    for match in rule.matcher.find(graph):
        reason = rule.check(ctx, match)
        if reason is not None:
            result.refused(f"{rule.name}: {reason}")
            continue
        before = [node.name for node in match.nodes]
        created = rule.rewrite(ctx, match)
        created = [] if created is None else [created] if isinstance(created, Node) else list(created)
        doomed.extend(match.nodes)
        result.rewrote({"rule": rule.name, "from": before, "to": [node.name for node in created]})
    if doomed:
        graph.remove_nodes(doomed)
