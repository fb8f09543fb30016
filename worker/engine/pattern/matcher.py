"""Matching a pattern at one node of the graph as it is now, extending edge by edge with backtracking.

Matching starts from the pattern op whose op types are rarest in the graph (the op-type index counts them),
so a Conv -> Relu pattern looks at each Conv, not at every Relu. A match binds every pattern node to a
distinct node or value, every node in the anchor's graph (a rewrite never spans a body and the graph around
it). A binding whose intermediates are read outside the match (by another node, a nested
body, or as a graph output), or whose ops have another output that is read, cannot be rewritten without
computing something twice: it is refused with a sentence saying which value is read by which node.
"""
from __future__ import annotations

from typing import Iterator

from worker.engine.ir import Graph, Node, Value
from worker.engine.pattern.pattern import OpPattern, Pattern, VarPattern

Element = OpPattern | VarPattern
Step = tuple[Element, Element, str, int]


class Match(dict):
    """key -> Node or Value, for every op and var of the pattern."""

    def __init__(self, pattern: Pattern, binding: dict[Element, Node | Value]):
        super().__init__((element.key, bound) for element, bound in binding.items())
        self.pattern = pattern
        self.nodes: list[Node] = [binding[op] for op in pattern.ops.values()]
        self.intermediate_values = [binding[v] for v in pattern.vars.values() if v.is_intermediate]

    def node(self, key: str) -> Node:
        return self[key]

    def value(self, key: str) -> Value:
        return self[key]

    @property
    def graph(self) -> Graph:
        return self.nodes[0].graph

    @property
    def output(self) -> Value | None:
        """The value the pattern computes (see ``Pattern.output``)."""
        var = self.pattern.output
        return None if var is None else self[var.key]


class Matcher:
    def __init__(self, pattern: Pattern):
        if not pattern.ops:
            raise ValueError(f"pattern {pattern.name!r} has no op")
        self.pattern = pattern
        first = next(iter(pattern.ops.values()))
        self._orders: dict[str, list[Step]] = {first.key: _traversal(pattern, first)}  # checks it is connected

    def anchor(self, graph: Graph) -> OpPattern:
        """The pattern op with the fewest candidates in ``graph`` (the first declared one on a tie; the first
        with none at once, as most rules find one of their ops missing from most graphs)."""
        best, fewest = None, -1
        for op in self.pattern.ops.values():
            count = 0
            for op_type in op.types:
                count += graph.count_of_type(op_type, op.domain)
            if count == 0:
                return op
            if fewest < 0 or count < fewest:
                best, fewest = op, count
        return best

    def candidates(self, graph: Graph) -> tuple[OpPattern, list[Node]]:
        """The anchor and its candidate nodes of ``graph`` (not its bodies), in graph order."""
        anchor = self.anchor(graph)
        found = [n for t in anchor.types for n in graph.nodes_of_type(t, anchor.domain)]
        return anchor, sorted(found, key=lambda n: n.position) if len(anchor.types) > 1 else found

    def matches(self, anchor: OpPattern, node: Node) -> Iterator[Match | str]:
        """Every binding with ``anchor`` at ``node``: a Match when it can be rewritten, else a sentence saying
        why not. Nothing when the pattern is not there at all."""
        if node.graph is None or not anchor.accepts(node):
            return
        order = self._order(anchor)
        for perm in _perms(anchor):
            for binding in self._extend(order, node.graph, {anchor: node}, {anchor: perm}, 0):
                match = Match(self.pattern, binding)
                yield _outside_reader(match, binding) or match

    def find(self, graph: Graph) -> list[Match]:
        """Every match in ``graph`` as it is, without rewriting: disjoint, first come first served."""
        anchor, nodes = self.candidates(graph)
        found, taken = [], set()
        for node in nodes:
            match = next((m for m in self.matches(anchor, node) if isinstance(m, Match)), None)
            if match is not None and not taken & {id(x) for x in match.nodes}:
                found.append(match)
                taken |= {id(x) for x in match.nodes}
        return found

    def _order(self, anchor: OpPattern) -> list[Step]:
        if anchor.key not in self._orders:
            self._orders[anchor.key] = _traversal(self.pattern, anchor)
        return self._orders[anchor.key]

    def _extend(self, order: list[Step], graph: Graph, binding: dict, perms: dict, index: int) -> Iterator[dict]:
        if index == len(order):
            if self._edges_hold(binding, perms):
                yield dict(binding)
            return
        element, via, relation, slot = order[index]
        # distinct elements bind distinct nodes and values, except constant leaves (one Constant read twice)
        shared = isinstance(element, VarPattern) and element.shared_constant and element.producer is None
        bound = {id(x) for e, x in binding.items()
                 if not (isinstance(e, VarPattern) and e.shared_constant and e.producer is None)} if shared \
            else {id(x) for x in binding.values()}
        for candidate, perm in _candidates(element, binding[via], via, relation, slot, perms):
            if id(candidate) in bound or not _accepts(element, candidate, graph):
                continue
            binding[element] = candidate
            if perm is not None:
                perms[element] = perm
            yield from self._extend(order, graph, binding, perms, index + 1)
            del binding[element]
            perms.pop(element, None)

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


def _traversal(pattern: Pattern, anchor: OpPattern) -> list[Step]:
    """A spanning order of the pattern from ``anchor``: (element, reached from, relation, slot)."""
    order: list[tuple[Element, Element | None, str, int]] = [(anchor, None, "anchor", 0)]
    seen: set[int] = {id(anchor)}
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
            if id(target) not in seen:
                seen.add(id(target))
                order.append((target, element, relation, slot))
        i += 1
    if len(seen) != len(pattern.ops) + len(pattern.vars):
        missing = [k for k, e in {**pattern.ops, **pattern.vars}.items() if id(e) not in seen]
        raise ValueError(f"pattern {pattern.name!r} is not connected: {missing} unreachable from {anchor.key!r}")
    return order[1:]


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


def _accepts(element: Element, candidate, graph: Graph) -> bool:
    if isinstance(element, OpPattern):
        return isinstance(candidate, Node) and candidate.graph is graph and element.accepts(candidate)
    return isinstance(candidate, Value) and element.accepts(candidate)


def _outside_reader(match: Match, binding: dict) -> str | None:
    """Why the matched ops cannot be replaced: an intermediate or another output of theirs is read outside."""
    inside = {id(n) for n in match.nodes}
    for value in match.intermediate_values:
        if value.is_graph_output:
            return f"the intermediate {value.name!r} is also a graph output"
        for use in value.uses:
            if id(use.node) not in inside:
                return f"the intermediate {value.name!r} is also read by {use.node.op_type} {use.node.name!r}"
    bound = {id(v) for v in binding.values() if isinstance(v, Value)}
    for op in match.pattern.ops.values():
        node = binding[op]
        for value in node.outputs if op.binds_outputs else ():
            if id(value) not in bound and value.is_used:
                return f"the output {value.name!r} of {node.op_type} {node.name!r} is used"
    return None


def _perms(op: OpPattern) -> list[tuple[int, int]]:
    return [(0, 1), (1, 0)] if op.commutative else [(0, 1)]


def _mapped(perm: tuple[int, int] | None, slot: int) -> int:
    """The node input slot that pattern input ``slot`` reads under ``perm`` (only slots 0 and 1 swap)."""
    return perm[slot] if perm is not None and slot < 2 else slot
