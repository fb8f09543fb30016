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

Solving is worker.engine.passes.support.pick_search. Equal costs go to the place the user listed first, then
to the better Paddle-Lite score (the tie-break is part of each option's cost).
"""
from __future__ import annotations

import math

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
#: The state of a port an int8 kernel absorbs (type_precision_cast replaces DQ -> Conv -> Q by QLinearConv):
#: the float value behind it is never read there (an input) or never made (the output), so it costs no cast.
ABSORBED: State = ("absorbed", Precision.ANY, Layout.ANY)


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
        """Costs a flow's casts could not be priced for (no cast chain the model knows joins its ends, though
        the cast passes found one) are infinite here: they are reported as null, which JSON can carry."""
        return {"cost": finite(self.cost), "greedy_cost": finite(self.greedy_cost),
                "lower_bound": finite(self.lower_bound), "method": self.method,
                "casts": self.casts, "greedy_casts": self.greedy_casts, "seconds": round(self.seconds, 4)}


def finite(cost: float) -> float | None:
    """A cost for the report: rounded, or None when it is not finite."""
    return round(cost, 1) if math.isfinite(cost) else None


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
    if source == ABSORBED:  # its producer's int8 kernel writes the QuantizeLinear's output instead
        return []
    demands = [port for port in demands if port != ABSORBED]
    value = flow.value
    target, precision, layout = source
    count = numel(value)
    found: list[tuple[str, int, str]] = []
    copies: dict[str, str] = {}
    keys: set = set()

    def copied(to: str | None) -> str:  # type_target_cast.copy_to: the memory the consumer reads it from
        if to is None or same_memory(target, to):  # None: a read from inside a body, never copied
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
                on = where if is_fetch or port[0] is None else port[0]
                if ("calib", where, on, wanted) not in keys:
                    keys.add(("calib", where, on, wanted))
                    found.append(("calib", count * _ITEMSIZE[wanted], on))
                held, now = ("calib", where, on, wanted), wanted
        if value.rank == 4 and port[2] is not Layout.ANY and port[2] is not layout:
            on = where if is_fetch or port[0] is None else port[0]
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
                "by_kind": dict(sorted(counts.items())), "cost": finite(cost)}

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
            inputs = tuple((port.target, port.precision, port.layout) for port in resolved.inputs)
            compute = node_compute(model, node, place, inputs, outputs, macs)
            tie = TIE * place_rank(places, place, has_layout) + ORDER * order
            if quantized:  # its ports are the QLinear op's, which reads and writes none of the node's values
                inputs, outputs = (ABSORBED,) * len(node.inputs), (ABSORBED,) * len(node.outputs)
            options.append(Option(candidate, compute + tie, compute, place, inputs, outputs))
    return options


def build_flows(graph, nodes: Sequence[Node], fetch_of: Callable[[Value], Place],
                options: Sequence[Sequence[Option]] = ()) -> list[Flow]:
    """Every value that may need a cast: graph inputs and node outputs that are read or leave the graph
    (weights, Constant outputs and non-tensors never do). A value an If/Loop/Scan body reads from outside is
    read by that node in its own type (bodies are never converted): each of the node's ``options`` gets one
    more input for it, which a calib but no io_copy serves (as type_precision_cast does)."""
    index = {node: i for i, node in enumerate(nodes)}

    def wanted(value: Value) -> bool:
        return value.type_proto is None and not is_constant(value)

    captured: dict[Value, list] = {}
    for i, node in enumerate(nodes):
        reads = list(dict.fromkeys(v for body in node.subgraphs() for inner in body.all_nodes()
                                   for v in inner.inputs if v is not None and v.graph is graph and wanted(v)))
        if reads and i < len(options):
            for k, value in enumerate(reads):
                captured.setdefault(value, []).append((i, len(node.inputs) + k))
            for option in options[i]:
                option.inputs = option.inputs[:len(node.inputs)] + tuple(
                    (None, precision_of_dtype(v.dtype), Layout.ANY) for v in reads)

    def consumers(value: Value) -> list:
        return [(index[use.node], use.slot) for use in value.uses if use.node in index] + captured.get(value, [])

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
