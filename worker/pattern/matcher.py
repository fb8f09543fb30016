"""Finding pattern matches: candidates from the op-type index, extended edge by edge with backtracking.

A match binds every pattern node to a distinct graph node or value. Matches whose intermediates are used
outside the match (by another node, a nested body, or as a graph output) are dropped, then overlapping matches
are dropped first-come-first-served in graph order, as Paddle-Lite's matcher does.
"""
from __future__ import annotations

from typing import Iterator

from worker.ir import Graph, Node, Value
from worker.pattern.pattern import OpPattern, Pattern, VarPattern

Element = OpPattern | VarPattern


class Match(dict):
    """key -> Node or Value, plus which bound things the rewrite removes."""

    def __init__(self, pattern: Pattern, binding: dict[Element, Node | Value]):
        super().__init__((element.key, bound) for element, bound in binding.items())
        self.pattern = pattern
        self.nodes = [binding[op] for op in pattern.ops.values()]
        self.intermediate_values = [binding[v] for v in pattern.vars.values() if v.is_intermediate]

    def node(self, key: str) -> Node:
        return self[key]

    def value(self, key: str) -> Value:
        return self[key]

    @property
    def removed(self) -> set[int]:
        return {id(x) for x in self.nodes} | {id(x) for x in self.intermediate_values}

    @property
    def touched(self) -> set[int]:
        return {id(x) for x in self.values()}


def _traversal(pattern: Pattern) -> list[tuple[Element, Element, str, int]]:
    """A spanning order of the pattern from its anchor: (element, reached from, relation, slot)."""
    anchor = pattern.anchor
    order: list[tuple[Element, Element | None, str, int]] = [(anchor, None, "anchor", 0)]
    seen: set[Element] = {anchor}
    i = 0
    while i < len(order):
        element = order[i][0]
        if isinstance(element, OpPattern):
            links = [(v, "input", s) for s, v in element.inputs.items()] + \
                    [(v, "output", s) for s, v in element.outputs.items()]
        else:
            links = ([(element.producer[0], "producer", element.producer[1])] if element.producer else []) + \
                    [(op, "consumer", s) for op, s in element.consumers]
        for target, relation, slot in links:
            if target not in seen:
                seen.add(target)
                order.append((target, element, relation, slot))
        i += 1
    if len(seen) != len(pattern.ops) + len(pattern.vars):
        missing = [k for k in list(pattern.ops) + list(pattern.vars)
                   if (pattern.ops.get(k) or pattern.vars.get(k)) not in seen]
        raise ValueError(f"pattern {pattern.name!r} is not connected: {missing} unreachable from the anchor")
    return order[1:]


class Matcher:
    def __init__(self, pattern: Pattern):
        self.pattern = pattern
        self.order = _traversal(pattern)

    def find(self, graph: Graph) -> list[Match]:
        """All valid, non-overlapping matches in ``graph`` (not its bodies), in graph order."""
        anchor = self.pattern.anchor
        candidates = sorted((n for t in anchor.types for n in graph.nodes_of_type(t, anchor.domain)),
                            key=lambda n: n.position)
        matches: list[Match] = []
        removed: set[int] = set()
        touched: set[int] = set()
        for node in candidates:
            if not anchor.accepts(node):
                continue
            match = self._first_match(node, removed, touched)
            if match is not None:
                matches.append(match)
                removed |= match.removed
                touched |= match.touched
        return matches

    def _first_match(self, node: Node, removed: set[int], touched: set[int]) -> Match | None:
        anchor = self.pattern.anchor
        for perm in _perms(anchor):
            for binding in self._extend({anchor: node}, {anchor: perm}, 0):
                match = Match(self.pattern, binding)
                if not _is_self_contained(match, binding):
                    continue
                if match.removed & touched or match.touched & removed:
                    continue  # overlaps an earlier match: first come, first served
                return match
        return None

    def _extend(self, binding: dict, perms: dict, index: int) -> Iterator[dict]:
        if index == len(self.order):
            if self._edges_hold(binding, perms):
                yield dict(binding)
            return
        element, via, relation, slot = self.order[index]
        bound = {id(x) for x in binding.values()}
        for candidate, perm in self._candidates(element, binding[via], via, relation, slot, perms):
            if id(candidate) in bound or not self._accepts(element, candidate):
                continue
            binding[element] = candidate
            if perm is not None:
                perms[element] = perm
            yield from self._extend(binding, perms, index + 1)
            del binding[element]
            perms.pop(element, None)

    @staticmethod
    def _candidates(element: Element, source, via: Element, relation: str, slot: int, perms: dict):
        if relation == "input":  # from an op's node to the value at one of its input slots
            value = source.input(_mapped(perms.get(via), slot))
            if value is not None:
                yield value, None
        elif relation == "output":
            if slot < len(source.outputs):
                yield source.outputs[slot], None
        elif relation == "producer":  # from a value to the node producing it at ``slot``
            if source.producer is not None and source.producer_slot == slot:
                for perm in _perms(element):
                    yield source.producer, perm
        else:  # consumer: from a value to each node reading it at pattern input ``slot``
            for node in dict.fromkeys(use.node for use in source.uses):
                node_slots = {use.slot for use in source.uses if use.node is node}
                for perm in _perms(element):
                    if _mapped(perm, slot) in node_slots:
                        yield node, perm

    @staticmethod
    def _accepts(element: Element, candidate) -> bool:
        if isinstance(element, OpPattern):
            return isinstance(candidate, Node) and element.accepts(candidate)
        return isinstance(candidate, Value) and all(pred(candidate) for _, pred in element.assertions)

    def _edges_hold(self, binding: dict, perms: dict) -> bool:
        for op in self.pattern.ops.values():
            node, perm = binding[op], perms.get(op)
            for slot, var in op.inputs.items():
                if node.input(_mapped(perm, slot)) is not binding[var]:
                    return False
            for slot, var in op.outputs.items():
                if slot >= len(node.outputs) or node.outputs[slot] is not binding[var]:
                    return False
        return True


def _is_self_contained(match: Match, binding: dict) -> bool:
    """No intermediate is read outside the match, and no removed op has an output the match ignores."""
    inside = {id(n) for n in match.nodes}
    for value in match.intermediate_values:
        if value.is_graph_output or any(id(use.node) not in inside for use in value.uses):
            return False
    bound_values = {id(v) for v in binding.values() if isinstance(v, Value)}
    for node in match.nodes:
        for value in node.outputs:
            if id(value) not in bound_values and value.is_used:
                return False
    return True


def _perms(op: OpPattern) -> list[tuple[int, int]]:
    return [(0, 1), (1, 0)] if op.commutative else [(0, 1)]


def _mapped(perm: tuple[int, int] | None, slot: int) -> int:
    """The node input slot that pattern input ``slot`` reads under ``perm`` (only slots 0 and 1 swap)."""
    return perm[slot] if perm is not None and slot < 2 else slot


def find_matches(graph: Graph, pattern: Pattern) -> list[Match]:
    return Matcher(pattern).find(graph)
