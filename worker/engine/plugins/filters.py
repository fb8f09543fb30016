"""Filters and callbacks: what a plugin binds to op types (or to every node) and to the whole graph.

As in the Sophon compiler's graph filters, a filter is a function of one node, bound to an op type with a
priority; filters of the same priority form a level, levels run lowest value first, and a level that changed
the graph sends the engine back to the first level (see ``engine.py``). ``LAYER_FIRST`` and ``LAYER_LAST``
bind a filter to every node: at its level, it runs on each node before (after) that node's op-type filters.

Priorities fall into bands, one per filter stage of the default pipeline, with the built-in constants in the
middle of each band so that a plugin can go before, between or after them (``PRIORITY_SIMPLIFY + 10``):

    band      priorities  stage pass        runs
    PRE         0 - 199   filter_pre        after type inference, before the support check and every
                                            built-in rewrite; pre-callbacks run first
    SIMPLIFY  200 - 299   filter_simplify   inside the simplify fixed point, after the built-in eliminations,
                                            folding, fusions and replacements of each round
    DOMAIN    300 - 399   filter_domain     after the fusions into mirserve ops, before kernel pick
    POST      400 - 499   filter_post       after kernel pick and casts, before memory planning;
                                            post-callbacks run last
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from worker.engine.passes.base import PassInfo

if TYPE_CHECKING:
    from worker.engine.ir import Node
    from worker.engine.passes.base import PassContext

#: Bind a filter to every node, before (LAYER_FIRST) or after (LAYER_LAST) the op-type filters of its level.
LAYER_FIRST = "LAYER_FIRST"
LAYER_LAST = "LAYER_LAST"

PRIORITY_PRE = 100
PRIORITY_SIMPLIFY = 250
PRIORITY_DOMAIN = 350
PRIORITY_POST = 450


@dataclass(frozen=True)
class Band:
    name: str
    low: int
    high: int  # exclusive
    stage: str
    runs: str

    def __contains__(self, priority: int) -> bool:
        return self.low <= priority < self.high

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "priorities": [self.low, self.high - 1], "stage": self.stage,
                "runs": self.runs}


BANDS = (
    Band("PRE", 0, 200, "filter_pre",
         "after type inference, before the support check and every built-in rewrite"),
    Band("SIMPLIFY", 200, 300, "filter_simplify",
         "in each round of the simplify fixed point, after the built-in eliminations, folding and fusions"),
    Band("DOMAIN", 300, 400, "filter_domain", "after the fusions into mirserve ops, before kernel pick"),
    Band("POST", 400, 500, "filter_post", "after kernel pick and casts, before memory planning"),
)
MAX_PRIORITY = BANDS[-1].high - 1


def band_of(priority: int) -> Band:
    for band in BANDS:
        if priority in band:
            return band
    raise ValueError(f"priority {priority} is outside the filter bands "
                     f"({', '.join(f'{b.name} {b.low}-{b.high - 1}' for b in BANDS)})")


#: ``fn(ctx, node)``: truthy when it changed the graph; a dict return also becomes the trace detail.
FilterFunction = Callable[["PassContext", "Node"], Any]
#: ``fn(ctx)`` on the whole graph; truthy when it changed the graph.
CallbackFunction = Callable[["PassContext"], Any]


@dataclass(frozen=True)
class Filter:
    """A per-node function bound to an op type (or every node) at a priority.

    ``info`` carries what a pass carries (level, targets, kernels, portable, origin), so the manager's skip
    rules apply to a filter exactly as to a pass, and ``disabled_passes`` may name it.
    """

    info: PassInfo
    op_type: str
    domain: str
    priority: int
    run: FilterFunction

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def binds(self) -> str:
        if self.op_type == LAYER_FIRST:
            return "every node, first"
        if self.op_type == LAYER_LAST:
            return "every node, last"
        return f"{self.domain}.{self.op_type}" if self.domain else self.op_type

    @property
    def band(self) -> Band:
        return band_of(self.priority)

    def to_dict(self) -> dict[str, Any]:
        data = self.info.to_dict(analyses=False)
        data.update(kind="filter", op_type=self.op_type, domain=self.domain, binds=self.binds,
                    priority=self.priority, band=self.band.name, stage=self.band.stage)
        return data


@dataclass(frozen=True)
class Callback:
    """A whole-graph function run before the first filter stage ("pre") or after the last one ("post")."""

    info: PassInfo
    when: str  # "pre" or "post"
    run: CallbackFunction

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def stage(self) -> str:
        return BANDS[0].stage if self.when == "pre" else BANDS[-1].stage

    def to_dict(self) -> dict[str, Any]:
        data = self.info.to_dict(analyses=False)
        data.update(kind=f"{self.when}_callback", stage=self.stage)
        return data


class FilterRegistry:
    """Filters and callbacks by name, in registration order (names share the pass namespace)."""

    def __init__(self) -> None:
        self._items: dict[str, Filter | Callback] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[Filter | Callback]:
        return iter(self._items.values())

    def get(self, name: str) -> Filter | Callback | None:
        return self._items.get(name)

    def filters(self) -> list[Filter]:
        return [f for f in self._items.values() if isinstance(f, Filter)]

    def callbacks(self, when: str) -> list[Callback]:
        return [c for c in self._items.values() if isinstance(c, Callback) and c.when == when]

    def add(self, item: Filter | Callback, passes) -> None:
        """Add ``item``; a name already taken by a filter, a callback or a pass of ``passes`` is refused."""
        name, origin = item.name, item.info.origin
        existing = self._items.get(name)
        if existing is not None:
            raise ValueError(f"{_kind(item)} {name!r} from {origin} clashes with the {_kind(existing)} of the "
                             f"same name from {existing.info.origin}")
        if name in passes:
            raise ValueError(f"{_kind(item)} {name!r} from {origin} clashes with the pass of the same name "
                             f"from {passes.get(name).info.origin}")
        self._items[name] = item

    def remove(self, name: str) -> None:
        self._items.pop(name, None)


def _kind(item: Filter | Callback) -> str:
    return "filter" if isinstance(item, Filter) else f"{item.when}-callback"


FILTERS = FilterRegistry()
