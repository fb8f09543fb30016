"""Rewrite rules: pattern -> check -> rewrite, the one way to write a local rewrite, bodies included.

    class ConvBatchNorm(Rule):
        name = "conv_bn"
        def build_pattern(self): ...                       # what to look for (see ``pattern.py``)
        def check(self, ctx, match): ...                   # a plan, or a sentence saying why not
        def rewrite(self, ctx, match, plan): ...           # the replacement

``check`` returns the plan that ``rewrite`` receives (any object; ``True`` when there is nothing to hand over),
a sentence when the match is refused (the trace counts it, so a user can see why a rewrite did *not*
happen), or None when the match is no candidate after all (nothing worth a line in the trace). A plan that
is a ``Value`` says "the pattern's output is this value": its readers read that value instead (forwarded once
``forward_refusal`` has nothing against it; ``rewrite`` is not called). Otherwise ``rewrite`` builds the
replacement, usually producing the pattern's output value itself (``Graph.add_node(outputs=[...])``) or
changing a matched node in place, and returns the new nodes (or an existing value to forward).

Rules are applied at each candidate of the graph as it is at that moment, in graph order, so a chain of
matches (Transpose -> Transpose -> Transpose) collapses in one run. After each rewrite the matched nodes
nothing reads any more, and whatever they were the last to read (old weights, Constant nodes, shape
computations), are removed (``Graph.remove_unused``): no rule cleans up after itself.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from worker.engine.ir.value import nameable
from worker.engine.ir import Graph, Node, Value
from worker.engine.pattern.matcher import Match, Matcher
from worker.engine.pattern.pattern import Pattern

if TYPE_CHECKING:
    from worker.engine.passes.base import PassContext, PassResult


class Rule:
    """Subclass: set ``name``, define ``build_pattern``, and ``check`` and ``rewrite`` as needed.

    A pattern is built once per process for each rule class, name and ``pattern_args`` (the attributes besides
    ``name`` that ``build_pattern`` reads, such as the op a parametrised rule matches), so rule objects stay
    cheap to make for each run of a pass and may hold what one run builds. tests/engine/pattern/test_rule.py
    checks that every rule's ``build_pattern`` reads nothing else of the rule.
    """

    name = "rule"
    pattern_args: tuple[str, ...] = ()

    #: The compiled patterns of every rule so far, by ``_pattern_key``.
    _compiled: dict[tuple, Matcher] = {}

    def __init__(self) -> None:
        self._matcher: Matcher | None = None

    @property
    def matcher(self) -> Matcher:
        if self._matcher is None:
            key = self._pattern_key()
            if key not in Rule._compiled:
                Rule._compiled[key] = Matcher(self.build_pattern())
            self._matcher = Rule._compiled[key]
        return self._matcher

    def _pattern_key(self) -> tuple:
        return (type(self), self.name, *(getattr(self, arg) for arg in self.pattern_args))

    def build_pattern(self) -> Pattern:
        raise NotImplementedError

    def check(self, ctx: "PassContext", match: Match) -> Any:
        """The plan for ``rewrite``, a refusal sentence, or None for no candidate (see the module docstring)."""
        return True

    def rewrite(self, ctx: "PassContext", match: Match, plan: Any) -> Node | Sequence[Node] | Value | None:
        """Build the replacement (never called for a plan that is a Value: that value is forwarded)."""
        raise NotImplementedError(f"rule {self.name!r} has no rewrite")


def describe(node: Node) -> str:
    """A node as refusal sentences name it: its op type and name."""
    return f"{node.op_type} {node.name!r}"


def forward_refusal(match: Match, value: Value) -> str | None:
    """Why readers of the pattern's output cannot read ``value`` instead, or None when they can."""
    out = match.output
    if out is None:
        raise ValueError(f"pattern {match.pattern.name!r} has no single output to forward")
    for extra in out.producer.outputs:
        if extra is not out and extra.is_used:
            return f"its output {extra.name!r} is used"
    if out.dtype and value.dtype and out.dtype != value.dtype:
        return f"{value.name!r} has another element type than {out.name!r}"
    return match.graph.bypass_refusal(out, value)


def apply_rules(ctx: "PassContext", rules: Iterable[Rule], result: "PassResult | None" = None) -> "PassResult":
    """Apply each rule at every candidate of every graph once (fixed-point groups of passes repeat them)."""
    from worker.engine.passes.base import PassResult

    result = result or PassResult()
    rules = list(rules)
    for graph in ctx.graph.live_graphs():
        for rule in rules:
            anchor, candidates = rule.matcher.candidates(graph)
            for node in candidates:
                for _ in range(MAX_REWRITES_AT_ONE_NODE):  # a node shared by several matches: one each time
                    if node.graph is not graph or not _rewrite_at(ctx, rule, anchor, node, result):
                        break
    return result


#: How often one candidate node may be rewritten in one run (a Reshape read by many Adds is one match each).
MAX_REWRITES_AT_ONE_NODE = 64


def _rewrite_at(ctx: "PassContext", rule: Rule, anchor, node: Node, result: "PassResult") -> bool:
    """Rewrite the first binding at ``node`` that the rule accepts; else count the first refusal. True when it
    rewrote."""
    refusal = None
    for match in rule.matcher.matches(anchor, node):
        plan = match if isinstance(match, str) else rule.check(ctx, match)
        if isinstance(plan, Value):
            plan = forward_refusal(match, plan) or plan
        if isinstance(plan, str):
            refusal = refusal or plan
        elif plan is not None:
            _apply(ctx, rule, match, plan, result)
            return True
    if refusal is not None:
        result.refused(f"{rule.name}: {refusal}")
    return False


def _apply(ctx: "PassContext", rule: Rule, match: Match, plan: Any, result: "PassResult") -> None:
    graph, matched = match.graph, match.nodes
    before = [node.name for node in matched]
    read = [v for node in matched for v in node.inputs if v is not None]
    outcome = plan if isinstance(plan, Value) else rule.rewrite(ctx, match, plan)
    if isinstance(outcome, Value):
        known = outcome.shape
        _forward(rule, graph, match, outcome)
        # the readers now read a value typed better than before, or the value learned from the one it replaced
        # what its other readers could use: inference types them again before whatever needs types next
        if better_known(known, match.output.shape) or outcome.shape != known:
            from worker.engine.passes.base import Analysis

            result.invalidate(Analysis.TYPES)
        outcome = None
    created = [] if outcome is None else [outcome] if isinstance(outcome, Node) else list(outcome)
    removed = graph.remove_unused([*matched, *read])
    kept = [node for node in dict.fromkeys([*created, *matched]) if node.graph is not None]
    replaced = list(dict.fromkeys([*before, *removed]))  # the matched nodes and what went with them
    result.rewrote({"rule": rule.name, "from": replaced, "to": [node.name for node in kept]})


def better_known(shape, than) -> bool:
    """``shape`` knows a dim that ``than`` does not (a number, or a name of the model's, where ``than`` has
    none, or one onnx made up): a Reshape that forwards ``(batch, sequence)`` where its output was
    ``(unk__0, sequence)`` leaves its readers typed worse than inference would now type them."""
    if shape is None:
        return False
    if than is None or len(than) != len(shape):
        return True
    return any(nameable(new) and not nameable(old) for new, old in zip(shape, than))


def _forward(rule: Rule, graph: Graph, match: Match, value: Value) -> None:
    out = match.output
    if not graph.bypass(out, value):
        raise AssertionError(f"rule {rule.name!r} forwarded {out.name!r} to {value.name!r}, which "
                             f"bypass refuses: {graph.bypass_refusal(out, value)}")
