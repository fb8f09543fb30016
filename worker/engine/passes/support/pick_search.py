"""Solving the placement plan (worker.engine.passes.support.pick_plan): the cheapest choice of options.

A graph whose nodes feed at most one other node each (chains, in-trees) is solved exactly by dynamic
programming; so is any graph whose open values stay few enough (pick_frontier: CNNs with residual and
squeeze-excite branches, within a bound of work known before solving). Any other graph starts from Paddle-Lite's greedy pick and improves it by moves that each lower
the exact cost: expansion moves (every node may switch to its cheapest option in one place; which ones do is
a minimum cut over the pairwise cast costs, checked against the exact cost) and single-node moves, for a
bounded number of rounds. No move may raise the casts (count or bytes) above the greedy pick's, and the plan
is never costlier than it. Work, not time, bounds the search: the plan does not depend on the machine's load.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from worker.engine.passes.support.pick_frontier import solve_frontier
from worker.engine.passes.support.pick_plan import Figures, Problem, State

#: Rounds of expansion moves, sweeps of single-node moves per round.
ROUNDS, SWEEPS = 4, 3


# --- exact: chains and in-trees --------------------------------------------------------------------------------
def is_forest(problem: Problem) -> bool:
    """Every node feeds at most one other node and every graph input at most one node: the plan is exact."""
    for node, writes in enumerate(problem.writes):
        readers = {c for index in writes for c, _ in problem.flows[index].consumers}
        if len(readers) > 1:
            return False
    return all(len({c for c, _ in f.consumers}) <= 1 for f in problem.flows if f.producer < 0)


def solve_forest(problem: Problem) -> list[int]:
    """Dynamic programming from the leaves: best[n][o] = cost of o + the best of every subtree feeding n."""
    count = len(problem.nodes)
    best: list[list[float]] = [[] for _ in range(count)]
    back: list[list[dict]] = [[] for _ in range(count)]
    feeders: list[dict[int, list[int]]] = [{} for _ in range(count)]   # consumer -> producer -> flows
    for index, flow in enumerate(problem.flows):
        for consumer in {c for c, _ in flow.consumers}:
            feeders[consumer].setdefault(flow.producer, []).append(index)
    for node in range(count):  # execution order: producers first
        row, links = [], []
        for option_index, own in enumerate(problem.costs[node]):
            cost, link = own, {}
            for producer, indices in sorted(feeders[node].items()):
                if producer < 0:
                    cost += sum(_single(problem, i, None, node, option_index) for i in indices)
                    continue
                pick, value = min(((p, best[producer][p] + sum(_single(problem, i, p, node, option_index)
                                                                for i in indices))
                                   for p in range(len(problem.options[producer]))), key=lambda kv: (kv[1], kv[0]))
                cost += value
                link[producer] = pick
            cost += sum(_single(problem, i, option_index, None, None) for i in problem.writes[node]
                        if not problem.flows[i].consumers)  # read by nobody: only a graph output
            row.append(cost)
            links.append(link)
        best[node], back[node] = row, links
    choice = [-1] * count
    for node in reversed(range(count)):
        if choice[node] < 0:  # a root: nothing reads it
            choice[node] = min(range(len(best[node])), key=lambda o: (best[node][o], o))
        for producer, pick in back[node][choice[node]].items():
            choice[producer] = pick
    return choice


def _single(problem: Problem, index: int, producer_option: int | None, consumer: int | None,
            consumer_option: int | None) -> float:
    """A flow's cost with its only consumer (if any) on the given option."""
    flow = problem.flows[index]
    source = flow.source_id if flow.producer < 0 else problem.outs[flow.producer][producer_option][flow.slot]
    demands = tuple(problem.ins[consumer][consumer_option][s] for c, s in flow.consumers
                    if c == consumer) if consumer is not None else ()
    return problem.flow_casts(index, source, demands)[0]


# --- bounded local search ----------------------------------------------------------------------------------
def improve(problem: Problem, choice: list[int], budget: tuple[int, int]) -> list[int]:
    """Expansion moves, then single-node moves, while they lower the exact cost (bounded rounds). A move is
    taken only if the plan's casts stay within ``budget`` (count, bytes): never more than the greedy pick's."""
    best_in: dict[State, dict[int, int]] = {}  # place -> node -> its cheapest option in that place
    for node, options in enumerate(problem.options):
        for index, option in enumerate(options):
            held = best_in.setdefault(option.place, {})
            if node not in held or problem.costs[node][index] < problem.costs[node][held[node]]:
                held[node] = index
    places = sorted(best_in, key=_place_order(problem))
    dirty = set(range(len(choice)))
    for _ in range(ROUNDS):
        moved = set()
        for place in places:
            moved |= _expand(problem, choice, best_in[place], budget)
        moved |= _sweep(problem, choice, budget, dirty | _around(problem, moved))
        if not moved:
            break
        dirty = _around(problem, moved)
    return choice


def _around(problem: Problem, nodes: set[int]) -> set[int]:
    """The nodes and their neighbours (producers they read, consumers of what they make)."""
    found = set(nodes)
    for node in nodes:
        for index in problem.reads[node]:
            if problem.flows[index].producer >= 0:
                found.add(problem.flows[index].producer)
        for index in problem.writes[node]:
            found.update(c for c, _ in problem.flows[index].consumers)
    return found


def _place_order(problem: Problem) -> Callable:
    first: dict = {}
    for options in problem.options:
        for option in options:
            first[option.place] = min(first.get(option.place, option.cost - option.compute),
                                      option.cost - option.compute)
    return lambda place: (first[place], str(place))


def _within(load: tuple[int, int], budget: tuple[int, int]) -> bool:
    return load[0] <= budget[0] and load[1] <= budget[1]


def _sweep(problem: Problem, choice: list[int], budget: tuple[int, int], nodes: set[int]) -> set[int]:
    """Single-node moves over ``nodes``, then over the neighbours of what moved; the nodes that moved."""
    moved: set[int] = set()
    count, size = problem.cast_load(choice)
    queue = sorted(n for n in nodes if len(problem.options[n]) > 1)
    for _ in range(SWEEPS):
        changed = set()
        for node in queue:
            keep = choice[node]
            cost, n, b = problem.local(node, choice)
            best, best_cost, best_load = keep, cost, (n, b)
            for option in range(len(problem.options[node])):
                if option == keep:
                    continue
                choice[node] = option
                cost, n2, b2 = problem.local(node, choice)
                if cost < best_cost - 1e-9 and _within((count - n + n2, size - b + b2), budget):
                    best, best_cost, best_load = option, cost, (n2, b2)
            choice[node] = best
            count, size = count - n + best_load[0], size - b + best_load[1]
            if best != keep:
                changed.add(node)
        moved |= changed
        if not changed:
            break
        queue = sorted(n for n in _around(problem, changed) if len(problem.options[n]) > 1)
    return moved


def _expand(problem: Problem, choice: list[int], best: dict[int, int], budget: tuple[int, int]) -> set[int]:
    """Let every node switch to its best option in one place at once (``best``: node -> that option); the
    switch set is a minimum cut. Returns the nodes that switched."""
    alternative = {node: option for node, option in best.items() if option != choice[node]}
    if not alternative:
        return set()
    variables = sorted(alternative)
    slot = {node: k for k, node in enumerate(variables)}
    unary = [[problem.costs[n][choice[n]], problem.costs[n][alternative[n]]] for n in variables]
    outs, ins = problem.outs, problem.ins
    pairs: dict[tuple[int, int], list[float]] = {}

    def option(node: int, label: int) -> int:
        return alternative[node] if label else choice[node]

    touched = sorted({i for n in variables for i in problem.reads[n] + problem.writes[n]})
    for index in touched:
        flow = problem.flows[index]
        producer = flow.producer if flow.producer in slot else None
        consumers = [(c, s) for c, s in flow.consumers if c in slot]
        if producer is None and not consumers:
            continue
        if producer is not None:  # the producer's own casts towards fixed consumers and the fetch
            fixed = tuple(ins[c][choice[c]][s] for c, s in flow.consumers if c not in slot)
            for label in (0, 1):
                source = outs[producer][option(producer, label)][flow.slot]
                unary[slot[producer]][label] += problem.flow_casts(index, source, fixed)[0]
        for consumer, s in consumers:
            for a in (0, 1):
                source = problem.source(flow, choice) if producer is None else \
                    outs[producer][option(producer, a)][flow.slot]
                costs = [problem.flow_casts(index, source,
                                            (ins[consumer][option(consumer, b)][s],))[0]
                         for b in (0, 1)]
                if producer is None:
                    unary[slot[consumer]][0] += costs[0]
                    unary[slot[consumer]][1] += costs[1]
                    break
                entry = pairs.setdefault((slot[producer], slot[consumer]), [0.0, 0.0, 0.0, 0.0])
                entry[2 * a] += costs[0]
                entry[2 * a + 1] += costs[1]
    labels = _min_cut(len(variables), unary, pairs)
    proposal = list(choice)
    for node, label in zip(variables, labels):
        if label:
            proposal[node] = alternative[node]
    switched = {node for node in variables if proposal[node] != choice[node]}
    if not switched or _delta(problem, choice, proposal, switched) >= -1e-6:
        return set()
    if not _within(problem.cast_load(proposal), budget):
        return set()
    choice[:] = proposal
    return switched


def _delta(problem: Problem, choice: list[int], proposal: list[int], switched: set[int]) -> float:
    """Exact cost of ``proposal`` minus that of ``choice``, which differ at ``switched``."""
    flows = {i for n in switched for i in problem.reads[n] + problem.writes[n]}
    delta = sum(problem.costs[n][proposal[n]] - problem.costs[n][choice[n]] for n in switched)
    return delta + sum(problem.flow_cost(i, proposal) - problem.flow_cost(i, choice) for i in flows)


def _min_cut(count: int, unary: list[list[float]], pairs: dict) -> list[int]:
    """Binary labels minimising sum(unary[i][x_i]) + sum(E_ij(x_i, x_j)) by a minimum s-t cut (pairwise terms
    that are not submodular are truncated: the move is checked against the exact cost anyway)."""
    big = float("inf")
    source, sink = count, count + 1
    graph = _FlowGraph(count + 2)
    theta = [list(u) for u in unary]
    for (i, j), (a, b, c, d) in pairs.items():
        if i == j:
            continue
        # E = a + (c - a) x_i + (d - c) x_j + (b + c - a - d) (1 - x_i) x_j
        theta[i][1] += c - a
        theta[j][1] += d - c
        weight = b + c - a - d
        if weight > 0 and weight != big:
            graph.add(i, j, weight)
    for i, (zero, one) in enumerate(theta):
        if one == big and zero == big:
            continue
        if one > zero:
            graph.add(source, i, one - zero)    # cut when i takes label 1
        elif zero > one:
            graph.add(i, sink, zero - one)      # cut when i keeps label 0
    reachable = graph.max_flow(source, sink)
    return [0 if i in reachable else 1 for i in range(count)]


class _FlowGraph:
    """Dinic's maximum flow; ``max_flow`` returns the nodes on the source side of a minimum cut."""

    def __init__(self, count: int):
        self.count = count
        self.edges: list[list] = []    # [to, capacity, index of reverse edge]
        self.adjacent: list[list[int]] = [[] for _ in range(count)]

    def add(self, a: int, b: int, capacity: float) -> None:
        self.adjacent[a].append(len(self.edges))
        self.edges.append([b, capacity, len(self.edges) + 1])
        self.adjacent[b].append(len(self.edges))
        self.edges.append([a, 0.0, len(self.edges) - 1])

    def _levels(self, source: int) -> list[int]:
        level = [-1] * self.count
        level[source] = 0
        queue = deque([source])
        while queue:
            node = queue.popleft()
            for e in self.adjacent[node]:
                to, capacity, _ = self.edges[e]
                if capacity > 1e-9 and level[to] < 0:
                    level[to] = level[node] + 1
                    queue.append(to)
        return level

    def max_flow(self, source: int, sink: int) -> set[int]:
        while True:
            level = self._levels(source)
            if level[sink] < 0:
                return {n for n in range(self.count) if level[n] >= 0}
            pointer = [0] * self.count
            while self._push(source, sink, level, pointer) > 1e-9:
                pass

    def _push(self, source: int, sink: int, level: list[int], pointer: list[int]) -> float:
        """One augmenting path in the level graph (iterative depth-first search)."""
        path: list[int] = []
        node = source
        while node != sink:
            advanced = False
            while pointer[node] < len(self.adjacent[node]):
                e = self.adjacent[node][pointer[node]]
                to, capacity, _ = self.edges[e]
                if capacity > 1e-9 and level[to] == level[node] + 1:
                    path.append(e)
                    node = to
                    advanced = True
                    break
                pointer[node] += 1
            if not advanced:
                if node == source:
                    return 0.0
                level[node] = -1  # a dead end: never again in this phase
                e = path.pop()
                node = self.edges[self.edges[e][2]][0]
                pointer[node] += 1
        pushed = min(self.edges[e][1] for e in path)
        for e in path:
            self.edges[e][1] -= pushed
            self.edges[self.edges[e][2]][1] += pushed
        return pushed


# --- entry point ---------------------------------------------------------------------------------------------
def solve(problem: Problem, greedy: list[int]) -> tuple[list[int], Figures]:
    """The cheapest choice found whose casts are no more (count and bytes) than the greedy pick's."""
    start = time.perf_counter()
    greedy_cost, budget = problem.total(greedy), problem.cast_load(greedy)
    choice, method = None, ""
    if budget == (0, 0) and all(costs[g] == min(costs) for costs, g in zip(problem.costs, greedy)):
        choice, method = list(greedy), "exact (the greedy pick meets the lower bound)"
    elif is_forest(problem):
        exact = solve_forest(problem)
        if _within(problem.cast_load(exact), budget):
            choice, method = exact, "exact (dynamic programming over chains and trees)"
    else:
        found = solve_frontier(problem)
        if found is not None and _within(problem.cast_load(found[0]), budget):
            choice, method = found[0], "exact (dynamic programming over the open values)"
    if choice is None:
        choice = improve(problem, list(greedy), budget)
        method = "local search from the greedy pick (expansion and single-node moves)"
    if problem.total(choice) > greedy_cost:
        choice = list(greedy)
    figures = Figures(problem.total(choice), greedy_cost, problem.lower_bound(), method,
                      problem.casts(choice), problem.casts(greedy), time.perf_counter() - start)
    return choice, figures
