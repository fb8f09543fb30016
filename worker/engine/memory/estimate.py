"""The whole memory estimate of a scheduled model: arenas per space, weights, io, MACs, and what stays unplanned.

Each If/Loop/Scan body is planned on its own, like a small graph whose inputs, outputs and outer values live
elsewhere; the largest body arena of a node is charged to that node's step in the parent as scratch. A space
with any value of unknown size is left unplanned, with the causes named, rather than planned on a guess.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from worker.engine.ir import Graph, Node
from worker.engine.memory.liveness import Liveness, analyze, is_view_op
from worker.engine.memory.macs import count_macs
from worker.engine.memory.plan import ArenaPlan, aligned
from worker.engine.memory.planner import plan_arena
from worker.engine.memory.report import arena_report
from worker.engine.memory.schedule import (constant_values, graph_facts, graph_steps, role_of, unread_unsized,
                                     value_space)
from worker.engine.memory.sizing import Cause, Sizing, unknown_causes

#: How many value names an unplanned entry lists (the count is always given).
LISTED_VALUES = 10
#: Unplanned kinds that leave their arena planned: the value is left out, not the arena.
NON_BLOCKING = frozenset({"unread_output", "io"})


@dataclass
class GraphPlan:
    """The plan of one graph (top level or body)."""

    arenas: dict[str, ArenaPlan]
    unplanned: list[dict]
    liveness: Liveness
    node_names: list[str]
    bodies: list["GraphPlan"] = field(default_factory=list)


def plan_graph(graph: Graph, sizing: Sizing, outer_constants: frozenset[str] = frozenset(),
               outer_causes: tuple[Mapping, Mapping] = ({}, {})) -> GraphPlan:
    """Plan ``graph``'s intermediates per memory space, its bodies first."""
    constants = constant_values(graph, outer_constants)
    causes, content = unknown_causes(graph, sizing, *outer_causes)
    scratch: dict[str, dict[str, int]] = {}
    blocked: dict[str, list[dict]] = {}
    bodies = []
    for node in graph:
        if node.subgraphs():
            plans = [plan_graph(b, sizing, frozenset(constants), (causes, content)) for b in node.subgraphs()]
            bodies += plans
            scratch[node.name] = _body_charge(plans)
            for entry in _body_unplanned(node, plans):
                blocked.setdefault(entry["space"], []).append(entry)
    left_out = unread_unsized(graph, sizing)
    steps = graph_steps(graph, scratch, frozenset(v.name for v in left_out))
    facts = graph_facts(graph, sizing, constants)
    liveness = analyze(steps, facts)
    unplanned = _unsized_entries(liveness, facts, causes)
    for entry in unplanned:
        blocked.setdefault(entry["space"], [])
    unplanned += [e for entries in blocked.values() for e in entries]
    # Values left out of a body plan are listed as they are; they block nothing here either.
    unplanned += [_left_out_entry(value) for value in left_out]
    unplanned += [e for plan in bodies for e in plan.unplanned if e["kind"] in NON_BLOCKING]
    arenas = {space: plan_arena(space, buffers, len(steps), _naive_bytes(liveness, facts, space))
              for space, buffers in _buffers_by_space(liveness).items() if space not in blocked}
    return GraphPlan(arenas, unplanned, liveness, [s.node for s in steps], bodies)


def _left_out_entry(value) -> dict:
    node = value.producer
    return {"space": value_space(value), "kind": "unread_output", "value": value.name, "node": node.name,
            "op": node.op_type, "values": [value.name], "value_count": 1,
            "reason": f"{value.name!r} ({node.op_type} node {node.name!r}) is never read and its size is not "
                      f"known: it is left out of the plan, which does not block the arena"}


def _naive_bytes(liveness: Liveness, facts, space: str) -> int:
    """Every value (and body scratch) in its own aligned buffer: no reuse, no views, no in-place writes."""
    total = 0
    for interval in liveness.intervals:
        if interval.space == space:
            sizes = [facts[v].nbytes or interval.nbytes for v in interval.values] or [interval.nbytes]
            total += sum(aligned(size) for size in sizes)
    return total


def _buffers_by_space(liveness: Liveness) -> dict[str, list]:
    by_space: dict[str, list] = {}
    for interval in liveness.intervals:
        if interval.nbytes is not None:
            by_space.setdefault(interval.space, []).append(interval.to_buffer())
    return by_space


def _body_charge(plans: list[GraphPlan]) -> dict[str, int]:
    """Bytes per space a node needs for its bodies: the largest body arena (only one body runs at a time)."""
    charge: dict[str, int] = {}
    for plan in plans:
        for space, arena in plan.arenas.items():
            charge[space] = max(charge.get(space, 0), arena.arena_bytes)
    return charge


def _body_unplanned(node: Node, plans: list[GraphPlan]) -> list[dict]:
    """Entries blocking the parent's spaces where a body's arena is unknown (left-out values do not)."""
    blocking = [e for plan in plans for e in plan.unplanned if e["kind"] not in NON_BLOCKING]
    entries = []
    for space in sorted({e["space"] for e in blocking}):
        reasons = sorted({e["reason"] for e in blocking if e["space"] == space})
        entries.append({"space": space, "kind": "subgraph", "node": node.name, "op": node.op_type,
                        "reason": f"a body of {node.op_type} node {node.name!r} could not be planned: "
                                  + "; ".join(reasons)})
    return entries


def _unsized_entries(liveness: Liveness, facts, causes: Mapping[str, frozenset[Cause]]) -> list[dict]:
    """One entry per (space, cause) for the buffers whose size is unknown."""
    grouped: dict[tuple[str, Cause], list[str]] = {}
    for interval in liveness.intervals:
        if interval.nbytes is not None:
            continue
        for cause in sorted(causes.get(interval.id) or {Cause("untyped", interval.id)}, key=repr):
            grouped.setdefault((interval.space, cause), []).append(interval.id)
    return [_cause_entry(space, cause, names) for (space, cause), names in sorted(
        grouped.items(), key=lambda item: (item[0][0], item[0][1].kind, item[0][1].key))]


def _cause_entry(space: str, cause: Cause, names: list[str]) -> dict:
    entry = {"space": space, "kind": cause.kind, "reason": cause.reason(), "values": names[:LISTED_VALUES],
             "value_count": len(names)}
    if cause.kind in ("symbolic_dims", "computed_from_dims") and cause.op != "graph input":
        entry["dims"] = [cause.key]
    else:
        entry.update(value=cause.key, node=cause.node, op=cause.op)
    return entry


def weights_by_space(graph: Graph, sizing: Sizing) -> dict[str, int]:
    """Stored bytes of every weight per space; a view of a weight (Reshape, io_copy in place) adds nothing."""
    totals: Counter = Counter()
    for body in graph.all_graphs():
        constants = constant_values(body, _outer_constants(body))
        for value in body.values():
            role = role_of(value, constants)
            if role == "initializer":
                totals[value_space(value)] += value.nbytes
            elif role == "constant" and not _is_weight_view(value):
                totals[value_space(value)] += sizing.nbytes(value) or 0
    return dict(sorted(totals.items()))


def _outer_constants(graph: Graph) -> frozenset[str]:
    names: set[str] = set()
    parent = graph.parent
    while parent is not None and parent.graph is not None:
        names |= constant_values(parent.graph)
        parent = parent.graph.parent
    return frozenset(names)


def _is_weight_view(value) -> bool:
    producer = value.producer
    if producer is None or not is_view_op(producer.op_type, producer.domain) or value.producer_slot != 0:
        return False
    source = producer.input(0)
    return source is not None and value_space(source) == value_space(value)


def _io_values(graph: Graph) -> list:
    values = {v.name: v for v in graph.inputs if not v.is_initializer}
    values.update((v.name, v) for v in graph.outputs)
    return list(values.values())


def io_bytes(graph: Graph, sizing: Sizing) -> int | None:
    """Exact bytes of the graph inputs and outputs, None when one of them has an unknown size."""
    sizes = [sizing.nbytes(v) for v in _io_values(graph)]
    return None if None in sizes else sum(sizes)


def _io_unknown_entries(graph: Graph, sizing: Sizing) -> list[dict]:
    """Why ``io_bytes`` is null: the graph inputs and outputs whose size is unknown."""
    entries = []
    for value in _io_values(graph):
        if sizing.nbytes(value) is None:
            kind = "graph input" if value.is_graph_input else "graph output"
            entries.append({"space": value_space(value), "kind": "io", "value": value.name,
                            "values": [value.name], "value_count": 1,
                            "reason": f"{kind} {value.name!r} has shape {_shape_text(sizing.shape(value))} "
                                      f"and element type {value.dtype}: its size, and so io_bytes, is unknown"})
    return entries


def _shape_text(shape) -> str:
    return "unknown" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def macs_report(graph: Graph, sizing: Sizing, opset: int | None = None,
                functions: Mapping[tuple[str, str], object] | None = None) -> dict:
    """MACs per node (bodies included, counted once) and their total.

    ``total`` is null, never a partial sum, when any node's count is unknown; ``known_total`` sums the nodes
    that are known, and ``unknown`` lists the others, each with the reason.
    """
    nodes, unknown = [], []
    for node in graph.all_nodes():
        count, reason = count_macs(node.op_type, node.domain,
                                   [sizing.shape(v) if v is not None else None for v in node.inputs],
                                   [sizing.shape(v) for v in node.outputs],
                                   {name: attr.value for name, attr in node.attributes.items()},
                                   input_types=[v.dtype if v is not None else 0 for v in node.inputs],
                                   opset=opset, functions=functions)
        if count is None:
            unknown.append({"node": node.name, "op": _qualified(node), "reason": reason})
        elif count:
            nodes.append({"node": node.name, "op": node.op_type, "macs": count})
    known = sum(n["macs"] for n in nodes)
    return {"total": None if unknown else known, "known_total": known, "nodes": nodes, "unknown": unknown}


def _qualified(node: Node) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain else node.op_type


def estimate_memory(graph: Graph, dim_bounds: Mapping[str, int] = {}, *, opset: int | None = None,
                    functions: Mapping[tuple[str, str], object] | None = None,
                    macs: bool = True) -> tuple[dict, GraphPlan]:
    """The report's ``memory`` section and the top-level plan behind it (``opset`` and the model's own
    ``functions`` by (domain, name) let MACs be counted inside function bodies; ``macs=False`` leaves them
    out, as None, for a plan only its arenas are wanted from)."""
    sizing = Sizing.from_bounds(graph, dim_bounds)
    plan = plan_graph(graph, sizing)
    arenas = [plan.arenas[space] for space in sorted(plan.arenas)]
    section = {
        "arenas": [arena_report(arena, plan.node_names) for arena in arenas],
        "weights_bytes": weights_by_space(graph, sizing),
        "io_bytes": io_bytes(graph, sizing),
        "paddle_lite_style_bytes": {a.space: a.paddle_lite_style_bytes for a in arenas},
        "macs": macs_report(graph, sizing, opset, functions) if macs else None,
        "unplanned": plan.unplanned + _io_unknown_entries(graph, sizing),
    }
    return section, plan


def in_place_summary(plan: GraphPlan) -> dict:
    """Counts for the trace: buffers, views and in-place writes taken, refusals by rule (bodies included)."""
    taken, refused, aliased, buffers = 0, Counter(), 0, 0
    for each in _all_plans(plan):
        taken += sum(d.accepted for d in each.liveness.decisions)
        refused.update(d.rule for d in each.liveness.decisions if not d.accepted)
        aliased += sum(len(i.values) - 1 for i in each.liveness.intervals)
        buffers += len(each.liveness.intervals)
    return {"buffers": buffers, "in_place": taken, "views": aliased - taken, "refusals": dict(refused)}


def _all_plans(plan: GraphPlan):
    yield plan
    for body in plan.bodies:
        yield from _all_plans(body)
