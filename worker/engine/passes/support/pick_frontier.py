"""The exact placement plan by dynamic programming over the open values (worker.engine.passes.support.pick_plan).

    open value   a flow made by a node already decided and still to be read by a node not yet decided
    state        (flow, the state its producer leaves it in, the states its decided consumers want) per open flow
    step n       for every state and every option of node n: add the option's cost, add n's demands to the
                 flows it reads, close the flows n reads last (their casts are then known), open what n makes

A flow's casts depend only on where it is made and the set of states its consumers want (one cast per
destination, shared), so two partial plans that reach the same state have the same best completion: the
cheaper one is kept. The result is the minimum of the plan's objective over every choice of every node.

The states multiply with the values open at once: two or three on a CNN with residual and squeeze-excite
branches, dozens on a transformer. Before solving, an upper bound on the work (states times options, summed
over the nodes) is computed from the graph's structure alone; past WORK the caller uses the local search.
The bound, not the clock, decides: the same graph is always solved the same way.
"""
from __future__ import annotations

import math

from worker.engine.passes.support.pick_plan import Problem

#: Most transitions (a state times an option of the next node) the pass solves exactly: about 0.3 s of
#: Python at worst on this machine (a benchmark may allow more, to prove what the pass's plan is worth).
WORK = 100_000


def _schedule(problem: Problem) -> tuple[list[list[tuple[int, int]]], list[list[int]], dict[int, int]]:
    """Per node: the (flow, slot) pairs it reads and the flows it reads last; per flow its last reader."""
    count = len(problem.nodes)
    reading: list[list[tuple[int, int]]] = [[] for _ in range(count)]
    closing: list[list[int]] = [[] for _ in range(count)]
    last: dict[int, int] = {}
    for index, flow in enumerate(problem.flows):
        for consumer, slot in flow.consumers:
            reading[consumer].append((index, slot))
        if flow.consumers:
            last[index] = max(c for c, _ in flow.consumers)
            closing[last[index]].append(index)
    return reading, closing, last


def work_bound(problem: Problem, work: float = WORK) -> float:
    """An upper bound on the transitions the solver makes: per node, its options times the product over the
    open flows of the producer's distinct states for it and its decided readers' distinct demands."""
    reading, closing, last = _schedule(problem)
    sources = {i: 1 if f.producer < 0 else len({o[f.slot] for o in problem.outs[f.producer]})
               for i, f in enumerate(problem.flows)}
    log_open = {i: math.log(sources[i]) for i, f in enumerate(problem.flows) if f.producer < 0 and i in last}
    total = 0.0
    for node in range(len(problem.nodes)):
        total += len(problem.options[node]) * math.exp(min(sum(log_open.values()), 700.0))
        if total > work:  # enough to refuse: the rest need not be counted
            return total
        for index, slot in reading[node]:
            log_open[index] += math.log(len({ins[slot] for ins in problem.ins[node]}))
        for index in closing[node]:
            log_open.pop(index, None)
        for index in problem.writes[node]:
            if index in last:
                log_open[index] = math.log(sources[index])
    return total


def solve_frontier(problem: Problem, work: float = WORK) -> tuple[list[int], float] | None:
    """The cheapest choice of every node's option and its cost, or None when the work bound exceeds ``work``."""
    if work_bound(problem, work) > work:
        return None
    reading, closing, last = _schedule(problem)
    flows, fixed = problem.flows, 0.0
    layout = []  # the open flows, in the order of a state's entries
    for index, flow in enumerate(flows):
        if flow.producer >= 0:
            continue
        if index in last:
            layout.append(index)
        else:  # a graph input that is also an output and read by nobody: its cast does not depend on the plan
            fixed += problem.flow_casts(index, flow.source_id, ())[0]
    states: dict[tuple, float] = {tuple((flows[i].source_id, ()) for i in layout): fixed}
    back: list[dict[tuple, tuple[tuple, int]]] = []
    for node in range(len(problem.nodes)):
        step = _Step(problem, node, layout, reading[node], closing[node], last)
        following: dict[tuple, float] = {}
        links: dict[tuple, tuple[tuple, int]] = {}
        for state, cost in states.items():
            for option, own in step.options:
                key, total = step.take(state, option)
                total += cost + own
                if total < following.get(key, math.inf):
                    following[key], links[key] = total, (state, option)
        states = following
        back.append(links)
        layout = step.after
    if not states:
        return None
    state, cost = min(states.items(), key=lambda item: item[1])
    choice = [0] * len(problem.nodes)
    for node in reversed(range(len(problem.nodes))):
        state, choice[node] = back[node][state]
    return choice, cost


class _Step:
    """One node's move from the states before it to the states after it.

    A state holds, per open flow in ``layout`` order, (the state its producer leaves it in, the sorted states
    its decided readers want). Which flows are open before and after a node does not depend on any choice, so
    where each flow sits is worked out once per node, not per transition. Options that read and make the same
    states lead every state to the same next state: only the cheapest of them is tried (the first on a tie, as
    when all are tried in order)."""

    def __init__(self, problem: Problem, node: int, layout: list[int], reads: list[tuple[int, int]],
                 closes: list[int], last: dict[int, int]):
        self.problem, self.ins, self.outs = problem, problem.ins[node], problem.outs[node]
        position = {index: p for p, index in enumerate(layout)}
        self.reads = [(position[index], slot) for index, slot in reads]
        self.closed = [(index, position[index]) for index in closes]
        written = problem.writes[node]
        self.outputs_only = [(index, problem.flows[index].slot) for index in written if index not in last]
        gone = set(closes)
        self.after = sorted([i for i in layout if i not in gone] + [i for i in written if i in last])
        # each entry of the next state: (True, position in this state) or (False, the output slot it comes from)
        self.recipe = [(True, position[i]) if i in position and i not in gone else (False, problem.flows[i].slot)
                       for i in self.after]
        cheapest: dict[tuple, tuple[float, int]] = {}
        for option, own in enumerate(problem.costs[node]):
            signature = (tuple(self.ins[option][slot] for _, slot in self.reads), self.outs[option])
            if signature not in cheapest or own < cheapest[signature][0]:
                cheapest[signature] = (own, option)
        self.options = sorted(((option, own) for own, option in cheapest.values()))

    def take(self, state: tuple, option: int) -> tuple[tuple, float]:
        """The state after this node takes ``option``, and the cost of the casts of the flows it closes."""
        entries = list(state)
        ins, outs = self.ins[option], self.outs[option]
        for p, slot in self.reads:
            source, demands = entries[p]
            wanted = ins[slot]
            if wanted not in demands:
                entries[p] = (source, tuple(sorted(demands + (wanted,))))
        flow_casts = self.problem.flow_casts
        cost = 0.0
        for index, p in self.closed:
            cost += flow_casts(index, *entries[p])[0]
        for index, slot in self.outputs_only:  # read by nobody: a graph output only
            cost += flow_casts(index, outs[slot], ())[0]
        return tuple(entries[p] if kept else (outs[p], ()) for kept, p in self.recipe), cost
