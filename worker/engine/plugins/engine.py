"""The filter engine: levels of filters by priority, restarted from the first level after any change.

The Sophon compiler's rule, on the IR: filters of one priority form a level; levels run lowest value first;
within a level every filter runs on every node it is bound to, in graph order, every graph of the model
(If/Loop/Scan bodies included); a level that changed the graph sends the engine back to the first level, so a
later filter's change is seen by every earlier one; the stage ends when a whole pass over the levels changes
nothing. A pair of filters that undo each other would loop forever, so after ``max_restarts`` restarts the
stage fails with an error naming the filters that kept changing the graph.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from worker.engine.errors import InternalError, MirserveError, PassError
from worker.engine.ir import Graph, Node
from worker.engine.passes.base import PassContext, PassResult
from worker.engine.passes.manager import skip_reason
from worker.engine.plugins.filters import FILTERS, LAYER_FIRST, LAYER_LAST, Band, Callback, Filter, FilterRegistry

#: Restarts of one stage before the engine gives up; real filter sets settle in a handful.
MAX_RESTARTS = 50
#: Rounds looked back on to name the filters of a loop (a pair that undo each other alternate).
_LOOP_WINDOW = 4


class FilterLoopError(PassError):
    """Filters kept changing the graph until the restart cap: most likely two of them undo each other."""


@dataclass
class Level:
    priority: int
    first: list[Filter] = field(default_factory=list)
    last: list[Filter] = field(default_factory=list)
    by_type: dict[tuple[str, str], list[Filter]] = field(default_factory=dict)

    def add(self, item: Filter) -> None:
        if item.op_type == LAYER_FIRST:
            self.first.append(item)
        elif item.op_type == LAYER_LAST:
            self.last.append(item)
        else:
            self.by_type.setdefault((item.domain, item.op_type), []).append(item)

    def filters_for(self, node: Node) -> list[Filter]:
        return self.first + self.by_type.get((node.domain, node.op_type), []) + self.last

    def candidates(self, graph: Graph) -> list[Node]:
        """The nodes this level visits, in graph order: all of them when a filter binds every node."""
        if self.first or self.last:
            return list(graph)
        nodes = [n for (domain, op) in self.by_type for n in graph.nodes_of_type(op, domain)]
        return sorted(nodes, key=lambda n: n.position)


def run_stage(ctx: PassContext, band: Band, *, before: Sequence[Callback] = (), after: Sequence[Callback] = (),
              registry: FilterRegistry = FILTERS, max_restarts: int = MAX_RESTARTS) -> PassResult:
    """Run the callbacks ``before``, the filters whose priority lies in ``band``, then the callbacks ``after``."""
    result = PassResult()
    counts: dict[str, int] = collections.Counter()
    skipped: dict[str, str] = {}
    active_before = _active(ctx, before, skipped)
    active_after = _active(ctx, after, skipped)
    filters = [f for f in registry.filters() if f.priority in band]
    active = _active(ctx, filters, skipped)
    for callback in active_before:
        _run_callback(ctx, callback, result, counts)
    restarts = _run_levels(ctx, _levels(active), result, counts, band, max_restarts)
    for callback in active_after:
        _run_callback(ctx, callback, result, counts)
    everything = [*before, *filters, *after]
    result.data.update(
        band=band.name, priorities=[band.low, band.high - 1], restarts=restarts,
        filters=[_summary(item, counts, skipped) for item in everything],
        plugins=sorted({item.info.origin for item in everything if counts[item.name]}),
    )
    return result


def _active(ctx: PassContext, items: Iterable[Filter | Callback], skipped: dict[str, str]) -> list:
    """The items the manager's skip rules let run (disabled by name, opt level, targets, kernels, portable)."""
    active = []
    for item in items:
        reason = skip_reason(item.info, ctx)
        if reason is None:
            active.append(item)
        else:
            skipped[item.name] = reason
    return active


def _levels(filters: Sequence[Filter]) -> list[Level]:
    levels: dict[int, Level] = {}
    for item in filters:
        levels.setdefault(item.priority, Level(item.priority)).add(item)
    return [levels[p] for p in sorted(levels)]


def _run_levels(ctx: PassContext, levels: list[Level], result: PassResult, counts: dict[str, int], band: Band,
                max_restarts: int) -> int:
    recent: collections.deque[set[str]] = collections.deque(maxlen=_LOOP_WINDOW)
    restarts = index = 0
    while index < len(levels):
        changed = _run_level(ctx, levels[index], result, counts)
        if not changed:
            index += 1
            continue
        recent.append(changed)
        if restarts == max_restarts:
            raise FilterLoopError(_loop_message(levels, recent, band, max_restarts))
        restarts += 1
        index = 0
    return restarts


def _run_level(ctx: PassContext, level: Level, result: PassResult, counts: dict[str, int]) -> set[str]:
    """One pass of one level over every graph; returns the names of the filters that changed something."""
    changed: set[str] = set()
    root = ctx.graph
    for graph in root.live_graphs():
        for node in level.candidates(graph):
            for item in level.filters_for(node):
                if node.graph is not graph:
                    break  # an earlier filter removed or replaced this node
                if _apply(ctx, item, node, graph, result):
                    changed.add(item.name)
                    counts[item.name] += 1
    if changed:
        _restore_order(root)
    return changed


def _apply(ctx: PassContext, item: Filter, node: Node, graph: Graph, result: PassResult) -> bool:
    name, op_type = node.name, node.op_type
    size = (len(graph), graph.value_count)
    outcome = _call(item, f"on node {name!r} ({op_type})", item.run, ctx, node)
    if not outcome and (len(graph), graph.value_count) == size:
        return False
    detail: dict[str, Any] = {"rule": item.name, "origin": item.info.origin, "priority": item.priority,
                              "node": name, "op_type": op_type}
    if isinstance(outcome, dict):
        detail.update(outcome)
    result.rewrote(detail)
    return True


def _run_callback(ctx: PassContext, callback: Callback, result: PassResult, counts: dict[str, int]) -> None:
    if _call(callback, "on the graph", callback.run, ctx):
        counts[callback.name] += 1
        result.rewrote({"rule": callback.name, "origin": callback.info.origin, "callback": callback.when})
        _restore_order(ctx.graph)


def _call(item: Filter | Callback, where: str, fn, *args) -> Any:
    try:
        return fn(*args)
    except MirserveError:
        raise
    except Exception as exc:  # a bug in a plugin: name the filter, its plugin and the node (the stage fails soft)
        kind = "filter" if isinstance(item, Filter) else f"{item.when}-callback"
        node = args[1] if len(args) > 1 and isinstance(args[1], Node) else None
        raise InternalError(f"{kind} {item.name!r} from {item.info.origin} failed {where}: "
                            f"{type(exc).__name__}: {exc}", node=node) from exc


def _restore_order(root: Graph) -> None:
    """Filters may append nodes anywhere; the next level (and the next pass) sees topological order."""
    for graph in list(root.all_graphs()):
        graph.toposort()


def _loop_message(levels: list[Level], recent: Iterable[set[str]], band: Band, cap: int) -> str:
    names = set().union(*recent)
    by_name = {f.name: f for level in levels for group in (level.first, level.last, *level.by_type.values())
               for f in group}
    culprits = [by_name[n] for n in sorted(names, key=lambda n: (by_name[n].priority, n))]
    described = " and ".join(f"{f.name!r} (priority {f.priority}, {f.binds}, from {f.info.origin})"
                             for f in culprits)
    noun = "filters" if len(culprits) > 1 else "filter"
    cause = ("they most likely undo each other's changes" if len(culprits) > 1 else
             "it most likely reports a change it does not make, or keeps rewriting its own output")
    return (f"{noun} {described} kept changing the graph: stage {band.stage} restarted from its first "
            f"level {cap} times without settling, so {cause}")


def _summary(item: Filter | Callback, counts: dict[str, int], skipped: dict[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {"name": item.name, "origin": item.info.origin, "changes": counts[item.name]}
    if isinstance(item, Filter):
        data.update(priority=item.priority, binds=item.binds)
    else:
        data["callback"] = item.when
    if item.name in skipped:
        data["skipped"] = skipped[item.name]
    return data
