"""The placement plan: every node's kernel chosen together, weighing what each choice costs its neighbours.

    node options   Conv: arm fp16 nhwc (cost 410k) | arm fp16 nchw (410k) | arm fp32 nchw (820k) | host ...
    value costs    y: arm/fp16/nhwc -> consumers wanting arm/fp16/nchw and arm/fp32/nchw
                      = layout cast (fixed + bytes) + calib (fixed + bytes), one per destination, shared
    plan           argmin  sum(node costs) + sum(value costs)

A node's options are its applicable kernels resolved against each state its inputs may arrive in (fp32 or
fp16, NCHW or NHWC), each with its compute cost from the cost model (worker.engine.kernels.cost). A value's
cost is that of the casts the cast passes will insert for it, counted the way they insert them: an io_copy
per destination memory (through the host between two devices), then a calib per (target, precision), then a
layout cast per (target, layout), each shared by every consumer that wants the same; graph outputs leave on
the host in their own type and NCHW; weights are converted in the file and cost nothing.

Solving: a graph whose nodes feed at most one other node each (chains, in-trees) is solved exactly by dynamic
programming. Any other graph starts from Paddle-Lite's greedy pick and improves it by moves that each lower
the exact cost: expansion moves (every node may switch to its best option in one place; the switch set is a
minimum cut over the pairwise cast costs) and single-node moves, until none helps or the budget is spent. The
plan is never worse than the greedy pick. Equal costs go to the place the user listed first, then to the
better Paddle-Lite score; the result is deterministic.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from onnx import helper

from worker.engine.ir import Node, Value
from worker.engine.kernels.cost import CostModel
from worker.engine.kernels.pick import NodeFacts, Port
from worker.engine.memory.macs import node_macs
from worker.engine.passes.support.placement import is_constant
from worker.engine.places import HOST, Layout, Place, Precision, ValidPlaces, get_target, precision_of_dtype

State = tuple  # (target name, Precision, Layout): where a value is, as its producer's kernel leaves it
FLOATS = (Precision.FP32, Precision.FP16)
_ITEMSIZE = {Precision.FP32: 4, Precision.FP16: 2, Precision.INT8: 1, Precision.INT32: 4, Precision.INT64: 8,
             Precision.BOOL: 1}
#: Ties: a place further down the user's list costs TIE units more per position, a worse-scored kernel of
#: the same place ORDER units more per position; both far below any real cost difference.
TIE, ORDER = 1e-3, 1e-6
#: Bounds of the local search: rounds of expansion moves, sweeps of single-node moves per round. Work, not
#: time, bounds it: the plan must not depend on how busy the machine is.
ROUNDS, SWEEPS = 4, 3


@dataclass
class Option:
    """One way to run a node: a candidate (anything with ``.pick``), its cost and the ports it declares."""

    candidate: Any
    cost: float                       # compute units plus the tie-break
    compute: float                    # compute units alone
    place: State                      # (target, precision, layout) the kernel resolved to
    inputs: tuple                     # (target, precision, layout) per input slot, as its kernel declares
    outputs: tuple                    # State per output slot


@dataclass
class Flow:
    """A value the plan may cast: made by a node (or a graph input) and read by nodes or the graph's caller."""

    value: Value
    producer: int                     # node index, -1 for a graph input
    slot: int
    consumers: list = field(default_factory=list)   # (node index, input slot)
    fetch: Place | None = None        # where it must leave when it is a graph output
    source: State | None = None       # a graph input's fixed state
    source_id: int = -1               # the same, interned by its Problem


@dataclass
class Figures:
    """What the plan reports: its cost, the greedy pick's, a lower bound, and the casts each inserts."""

    cost: float
    greedy_cost: float
    lower_bound: float
    method: str
    casts: dict
    greedy_casts: dict
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"cost": round(self.cost, 1), "greedy_cost": round(self.greedy_cost, 1),
                "lower_bound": round(self.lower_bound, 1), "method": self.method,
                "casts": self.casts, "greedy_casts": self.greedy_casts, "seconds": round(self.seconds, 4)}


# --- sizes --------------------------------------------------------------------------------------------------
def numel(value: Value) -> int:
    """Elements of ``value``; an unknown dim counts as 1 (costs only need to rank the options)."""
    shape = value.shape
    if shape is None:
        return 1
    total = 1
    for dim in shape:
        total *= dim if isinstance(dim, int) and dim > 0 else 1
    return total


def itemsize(precision: Precision, dtype: int) -> int:
    if precision in _ITEMSIZE:
        return _ITEMSIZE[precision]
    try:
        return helper.tensor_dtype_to_np_dtype(dtype).itemsize if dtype else 4
    except (KeyError, TypeError, ValueError):
        return 4


def same_memory(a: str, b: str) -> bool:
    return get_target(a).shares_memory_with(get_target(b))


# --- casts of one value ----------------------------------------------------------------------------------
def casts_of(flow: Flow, source: State, demands: Sequence[State]) -> list[tuple[str, int, str]] | None:
    """The casts (kind, bytes written, target whose kernel runs it) the cast passes insert for ``flow`` made in ``source`` and read as
    ``demands`` say ((target, precision, layout) per consumer's port, and its fetch place, for a graph output); None when no cast could convert it."""
    value = flow.value
    target, precision, layout = source
    count = numel(value)
    found: list[tuple[str, int, str]] = []
    copies: dict[str, str] = {}
    keys: set = set()

    def copied(to: str) -> str:  # type_target_cast.copy_to: the memory the consumer reads the value from
        if same_memory(target, to):
            return target
        if to not in copies:
            if not same_memory(target, HOST.name) and not same_memory(to, HOST.name):
                copied(HOST.name)
            copies[to] = to
            device = to if same_memory(target, HOST.name) else target  # the device's io_copy kernel runs it
            found.append(("io_copy", count * itemsize(precision, value.dtype), device))
        return to

    def converted(port: State, is_fetch: bool) -> bool:
        where = copied(port[0])
        held: tuple = (where,)   # which value the consumer reads: the source, its copy, or a calib of either
        wanted = port[1]
        now = precision
        if wanted is not Precision.ANY and now is not Precision.ANY and wanted is not now:
            if is_fetch and wanted not in FLOATS:
                pass
            elif wanted not in FLOATS or now not in FLOATS:
                return False
            else:
                on = where if is_fetch else port[0]
                if ("calib", where, on, wanted) not in keys:
                    keys.add(("calib", where, on, wanted))
                    found.append(("calib", count * _ITEMSIZE[wanted], on))
                held, now = ("calib", where, on, wanted), wanted
        if value.rank == 4 and port[2] is not Layout.ANY and port[2] is not layout:
            on = where if is_fetch else port[0]
            if ("layout", held, on, port[2]) not in keys:
                keys.add(("layout", held, on, port[2]))
                found.append(("layout", count * itemsize(now, value.dtype), on))
        return True

    for port in demands:
        if not converted(port, False):
            return None
    if flow.fetch is not None:
        fetch = flow.fetch
        if not converted((fetch.target.name, fetch.precision, fetch.layout), True):
            return None
    return found


# --- the problem ---------------------------------------------------------------------------------------------
class Problem:
    """Nodes with their options, the values between them, and the exact cost of any choice."""

    def __init__(self, nodes: list[Node], options: list[list[Option]], flows: list[Flow], model: CostModel):
        self.nodes, self.options, self.flows, self.model = nodes, options, flows, model
        # States as small integers: the cost memo hashes them millions of times on a large graph
        self.states: list[State] = []
        ids: dict[State, int] = {}

        def intern(state: State) -> int:
            if state not in ids:
                ids[state] = len(self.states)
                self.states.append(state)
            return ids[state]

        self.outs = [[tuple(intern(s) for s in o.outputs) for o in opts] for opts in options]
        self.ins = [[tuple(intern(p) for p in o.inputs) for o in opts] for opts in options]
        self.costs = [[o.cost for o in opts] for opts in options]
        for flow in flows:
            flow.source_id = intern(flow.source) if flow.producer < 0 else -1
        self.reads: list[list[int]] = [[] for _ in nodes]    # flows each node reads
        self.writes: list[list[int]] = [[] for _ in nodes]   # flows each node makes
        for index, flow in enumerate(flows):
            if flow.producer >= 0:
                self.writes[flow.producer].append(index)
            for consumer in dict.fromkeys(c for c, _ in flow.consumers):
                self.reads[consumer].append(index)
        self._memo: dict = {}

    def source(self, flow: Flow, choice: Sequence[int]) -> int:
        """The (interned) state the flow's producer leaves it in."""
        if flow.producer < 0:
            return flow.source_id
        return self.outs[flow.producer][choice[flow.producer]][flow.slot]

    def demands(self, flow: Flow, choice: Sequence[int]) -> tuple:
        """The (interned) states its consumers read it in."""
        return tuple(self.ins[c][choice[c]][s] for c, s in flow.consumers)

    def flow_casts(self, index: int, source: int, demands: tuple) -> tuple[float, list | None, int, int]:
        """The cost of a flow's casts, the casts, their count and their bytes."""
        key = (index, source, demands)
        found = self._memo.get(key)
        if found is None:
            states = self.states
            casts = casts_of(self.flows[index], states[source], [states[d] for d in demands])
            cost = float("inf") if casts is None else sum(self.model.cast(*cast) for cast in casts)
            found = self._memo[key] = (cost, casts, len(casts or ()), sum(cast[1] for cast in casts or ()))
        return found

    def flow_entry(self, index: int, choice: Sequence[int]) -> tuple:
        flow = self.flows[index]
        return self.flow_casts(index, self.source(flow, choice), self.demands(flow, choice))

    def flow_cost(self, index: int, choice: Sequence[int]) -> float:
        flow = self.flows[index]
        return self.flow_casts(index, self.source(flow, choice), self.demands(flow, choice))[0]

    def total(self, choice: Sequence[int]) -> float:
        return (sum(self.costs[i][c] for i, c in enumerate(choice))
                + sum(self.flow_cost(i, choice) for i in range(len(self.flows))))

    def compute(self, choice: Sequence[int]) -> float:
        return sum(self.options[i][c].compute for i, c in enumerate(choice))

    def casts(self, choice: Sequence[int]) -> dict:
        """Casts by kind with their count and bytes, and their cost."""
        counts: dict[str, dict] = {}
        cost = 0.0
        for index in range(len(self.flows)):
            found, casts, _, _ = self.flow_entry(index, choice)
            cost += found
            for kind, size, _ in casts or ():
                entry = counts.setdefault(kind, {"count": 0, "bytes": 0})
                entry["count"] += 1
                entry["bytes"] += size
        return {"count": sum(e["count"] for e in counts.values()), "bytes": sum(e["bytes"] for e in counts.values()),
                "by_kind": dict(sorted(counts.items())), "cost": round(cost, 1)}

    def lower_bound(self) -> float:
        """No plan costs less: every node on its cheapest option, no cast at all."""
        return sum(min(o.compute for o in options) for options in self.options)

    def cast_load(self, choice: Sequence[int], nodes: Sequence[int] | None = None) -> tuple[int, int]:
        """Count and bytes of the casts of every flow (or of the flows around ``nodes``)."""
        if nodes is None:
            indices: Sequence[int] = range(len(self.flows))
        else:
            indices = list(dict.fromkeys(i for n in nodes for i in self.reads[n] + self.writes[n]))
        count = size = 0
        for index in indices:
            _, _, n, b = self.flow_entry(index, choice)
            count, size = count + n, size + b
        return count, size

    def local(self, node: int, choice: list[int]) -> tuple[float, int, int]:
        """The part of the cost, the cast count and the cast bytes that depend on ``node``'s option."""
        cost, count, size = self.costs[node][choice[node]], 0, 0
        for index in self.reads[node] + self.writes[node]:
            found, _, n, b = self.flow_entry(index, choice)
            cost, count, size = cost + found, count + n, size + b
        return cost, count, size


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
    if budget == (0, 0) and problem.compute(greedy) <= problem.lower_bound() * (1 + 1e-12):
        choice, method = list(greedy), "exact (the greedy pick meets the lower bound)"
    elif is_forest(problem):
        exact = solve_forest(problem)
        if _within(problem.cast_load(exact), budget):
            choice, method = exact, "exact (dynamic programming over chains and trees)"
    if choice is None:
        choice = improve(problem, list(greedy), budget)
        method = "local search from the greedy pick (expansion and single-node moves)"
    if problem.total(choice) > greedy_cost:
        choice = list(greedy)
    figures = Figures(problem.total(choice), greedy_cost, problem.lower_bound(), method,
                      problem.casts(choice), problem.casts(greedy), time.perf_counter() - start)
    return choice, figures


def node_compute(model: CostModel, node: Node, option_place: State, inputs: tuple, outputs: tuple,
                 macs: int) -> float:
    """Compute units of ``node`` on a kernel that reads ``inputs`` and writes ``outputs`` (States)."""
    target, precision, _ = option_place
    nbytes = 0
    for value, port in zip(node.inputs, inputs):
        if value is not None:
            nbytes += numel(value) * itemsize(port[1], value.dtype)
    for value, state in zip(node.outputs, outputs):
        if value is not None and state is not None:
            nbytes += numel(value) * itemsize(state[1], value.dtype)
    return model.compute(target, precision, macs, nbytes)


def macs_of(node: Node) -> int:
    """MACs of a node from its shapes (0 where they are not known: its bytes still count)."""
    attributes = {name: attr.value for name, attr in node.attributes.items()}
    try:
        found = node_macs(node.op_type, node.domain, [v.shape if v is not None else None for v in node.inputs],
                          [v.shape for v in node.outputs], attributes)
    except Exception:  # a counter that meets shapes it does not expect: count bytes only
        return 0
    return found or 0


# --- building the problem ------------------------------------------------------------------------------------
def input_variants(facts: NodeFacts, places: ValidPlaces, memo: dict | None = None) -> list[NodeFacts]:
    """The node's facts with its inputs arriving in each precision and layout the places allow (weights as
    they are): the states a producer's choice may leave them in. ``memo`` shares the changed input facts."""
    memo = {} if memo is None else memo
    floats = {i for i, v in enumerate(facts.inputs) if v is not None and not v.is_constant and v.dtype in (1, 10)}
    rank4 = {i for i, v in enumerate(facts.inputs) if v is not None and not v.is_constant and v.rank == 4}
    allowed_precisions = {p.precision for p in places}
    allowed_layouts = {p.layout for p in places}
    precisions = [p for p in FLOATS if p in allowed_precisions or Precision.ANY in allowed_precisions]
    layouts = [l for l in (Layout.NCHW, Layout.NHWC) if l in allowed_layouts or Layout.ANY in allowed_layouts]
    found, seen = [], {facts.inputs}
    for precision in precisions if floats else [None]:
        for layout in layouts if rank4 else [None]:
            inputs = list(facts.inputs)
            for i in floats | rank4:
                key = (inputs[i], precision if i in floats else None, layout if i in rank4 else None)
                changed = memo.get(key)
                if changed is None:
                    changed = inputs[i]
                    if key[1] is not None:
                        changed = replace(changed, precision=key[1], dtype=1 if key[1] is Precision.FP32 else 10)
                    if key[2] is not None:
                        changed = replace(changed, layout=key[2])
                    memo[key] = changed
                inputs[i] = changed
            inputs = tuple(inputs)
            if inputs not in seen:
                seen.add(inputs)
                found.append(replace(facts, inputs=inputs))
    return found


def output_state(port: Port, value: Value) -> State:
    """Where an output is once its kernel ran (as variable_place_inference places it)."""
    precision = port.precision if port.precision is not Precision.ANY else precision_of_dtype(value.dtype)
    layout = port.layout if port.layout is not Layout.ANY and value.rank == 4 else Layout.NCHW
    return (port.target, precision, layout)


def place_rank(places: ValidPlaces, place: State, has_layout: bool) -> int:
    """Position of the first valid place a resolved kernel runs in (the user's order, for ties)."""
    target, precision, layout = place
    for index, candidate in enumerate(places):
        if candidate.target.name != target:
            continue
        if precision in FLOATS and candidate.precision not in (precision, Precision.ANY):
            continue
        if has_layout and layout is not Layout.ANY and candidate.layout not in (layout, Layout.ANY):
            continue
        return index
    return len(places)


def build_options(node: Node, variants: Sequence[Sequence[Any]], places: ValidPlaces,
                  model: CostModel) -> list[Option]:
    """The node's options from its candidates under each input state, the greedy pick first.

    Whether the node runs in its quantized form (a Q/DQ sandwich absorbed into an int8 kernel) stays as the
    greedy pick decided: that changes what the model computes, which the user's place order decides, not a
    cost. ``variants[0][0]`` is the greedy pick.
    """
    macs = macs_of(node)
    quantized = variants[0][0].qdq is not None
    has_layout = any(v is not None and v.rank == 4 for v in [*node.inputs, *node.outputs])
    options: list[Option] = []
    seen: set = set()
    for ranked in variants:
        for order, candidate in enumerate(ranked):
            if (candidate.qdq is not None) is not quantized:
                continue
            resolved = candidate.scored.resolved
            outputs = tuple(output_state(port, value) for port, value in zip(resolved.outputs, node.outputs))
            key = (resolved.kernel.id, resolved.precision, resolved.layout, resolved.inputs, outputs)
            if key in seen:
                continue
            seen.add(key)
            place = (resolved.kernel.target, resolved.precision, resolved.layout)
            compute = node_compute(model, node, place, tuple((p.target, p.precision, p.layout)
                                                             for p in resolved.inputs), outputs, macs)
            tie = TIE * place_rank(places, place, has_layout) + ORDER * order
            inputs = tuple((port.target, port.precision, port.layout) for port in resolved.inputs)
            options.append(Option(candidate, compute + tie, compute, place, inputs, outputs))
    return options


def build_flows(graph, nodes: Sequence[Node], fetch_of: Callable[[Value], Place]) -> list[Flow]:
    """Every value that may need a cast: graph inputs and node outputs that are read or leave the graph
    (weights, Constant outputs and non-tensors never do)."""
    index = {node: i for i, node in enumerate(nodes)}

    def consumers(value: Value) -> list:
        return [(index[use.node], use.slot) for use in value.uses if use.node in index]

    def wanted(value: Value) -> bool:
        return value.type_proto is None and not is_constant(value)

    flows = []
    for value in graph.inputs:
        if value.is_initializer or not wanted(value):
            continue
        flows.append(Flow(value, -1, 0, consumers(value), fetch_of(value) if value.is_graph_output else None,
                          (HOST.name, precision_of_dtype(value.dtype), Layout.NCHW)))
    for i, node in enumerate(nodes):
        for slot, value in enumerate(node.outputs):
            if not wanted(value):
                continue
            readers, fetch = consumers(value), fetch_of(value) if value.is_graph_output else None
            if readers or fetch is not None:
                flows.append(Flow(value, i, slot, readers, fetch))
    return flows
