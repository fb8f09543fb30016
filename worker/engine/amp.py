"""Auto mixed precision: the fewest nodes that must compute in fp32 for a model placed on fp16 places to verify.

When verification fails with fp16 places, the failed candidate and the input model run once more, each with
every value of the main graph as an output (``numeric.value_errors``): each value gets its error against the
input's, in units of the verification tolerance. A node's *error growth* is the error of its outputs less the
largest error it was given (through casts, which add none of their own), so a node that merely passes on an
error its producers made ranks low. The nodes computing in fp16 are ranked by growth, and a bisection over
that order finds the shortest prefix that verifies when pinned to fp32 (``PassContext.pinned_fp32``, read by
static_kernel_pick); each step rebuilds the model and verifies it (one runtime run of each model). Then the
pins are tried without, least ranked first (one by one when few, in halves when many), so no pinned node is
there for nothing.

onnxconverter-common's ``auto_mixed_precision`` bisects over the nodes in graph order, blind to where the
error comes from; ``bench/amp.py`` measures both (steps, seconds, nodes pinned).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from worker.engine.ir import Graph, Node
from worker.engine.passes.place.type_layout_cast import picked_name
from worker.engine.passes.support.casts import is_cast
from worker.engine.places import Precision

#: An error that is not finite (``numeric.NOT_FINITE_ERROR``).
NOT_FINITE = 1e30
#: Up to this many pins, each is tried without its pin on its own (one step each); more, in halves.
SINGLES = 4
#: Steps (a rebuild and a verification each) the search may take: past them, unpinning stops and what
#: verified last is kept (more pins than needed, never a model that does not verify).
MAX_STEPS = 40


@dataclass
class Ranked:
    node: str  # its name when kernel pick ran, which pins it
    op: str
    growth: float  # error made here, in tolerances (outputs' error less the inputs')
    error: float  # the error of its outputs, in tolerances


@dataclass
class Outcome:
    pinned: list[Ranked] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    passed: bool = False

    @property
    def runs(self) -> int:
        return len(self.steps)


def fp16_nodes(graph: Graph) -> list[Node]:
    """Compute nodes of the main graph placed to compute in fp16 (casts are not computation)."""
    return [n for n in graph if getattr(n, "pick", None) is not None and not is_cast(n)
            and n.pick.place.precision is Precision.FP16]


def rank(graph: Graph, errors: dict[str, float]) -> list[Ranked]:
    """The fp16 nodes, most error growth first; ties (and nodes whose outputs could not be compared: last)
    in graph order."""
    memo: dict[str, float] = {}

    def arrived(value) -> float:
        """The error a value carries: measured, or what the cast producing it was given."""
        if value is None:
            return 0.0
        if value.name in errors:
            return errors[value.name]
        if value.name in memo:
            return memo[value.name]
        memo[value.name] = 0.0
        producer = value.producer
        if producer is not None and is_cast(producer):
            memo[value.name] = max((arrived(v) for v in producer.inputs), default=0.0)
        return memo[value.name]

    ranked = []
    for index, node in enumerate(fp16_nodes(graph)):
        measured = [errors[v.name] for v in node.outputs if v is not None and v.name in errors]
        if not measured:  # only through a cast after it: what the cast's output carries
            measured = [arrived(c.outputs[0]) for v in node.outputs if v is not None for c in v.consumers()
                        if is_cast(c) and c.outputs]
        given = max((arrived(v) for v in node.inputs), default=0.0)
        error = max(measured, default=0.0)
        growth = 0.0 if given >= NOT_FINITE else max(error - given, 0.0)
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        ranked.append((not measured, -growth, -error, index, Ranked(picked_name(node), op, growth, error)))
    ranked.sort(key=lambda item: item[:4])
    return [item[4] for item in ranked]


Trial = Callable[[Sequence[str]], "tuple[bool, str]"]


def search(order: Sequence[Ranked], trial: Trial, *, prune: bool = True, seconds: float | None = None) -> Outcome:
    """The shortest prefix of ``order`` that verifies when pinned (``trial(names)`` -> passed, what it found),
    then each of its nodes tried without its pin (when ``prune``). Assumes pinning more never hurts. After
    ``seconds`` (or MAX_STEPS steps) no new step starts: the set that verified last is kept."""
    outcome = Outcome()
    deadline = None if seconds is None else time.perf_counter() + seconds

    def spent() -> bool:
        return len(outcome.steps) >= MAX_STEPS or (deadline is not None and time.perf_counter() > deadline)

    failed: set[frozenset[str]] = set()  # pin sets seen to fail: the unpinning phase meets the bisection's again

    def attempt(chosen: Sequence[Ranked]) -> bool:
        names = [r.node for r in chosen]
        if frozenset(names) in failed:
            return False
        started = time.perf_counter()
        passed, found = trial(names)
        outcome.steps.append({"pinned": len(chosen), "passed": passed, "found": found,
                              "seconds": round(time.perf_counter() - started, 3)})
        if not passed:
            failed.add(frozenset(names))
        return passed

    if not order or not attempt(order):
        return outcome
    low, high = 0, len(order)  # prefix low fails (the first build: no pins), prefix high passes
    while high - low > 1 and not spent():
        middle = (low + high) // 2
        if attempt(order[:middle]):
            high = middle
        else:
            low = middle
    chosen = list(order[:high])
    if prune and len(chosen) > 1:
        chosen = _unpin(chosen, attempt, spent)
    outcome.pinned, outcome.passed = chosen, True
    return outcome


def _unpin(chosen: list[Ranked], attempt: Callable[[Sequence[Ranked]], bool],
           spent: Callable[[], bool]) -> list[Ranked]:
    """``chosen`` less the pins it verifies without: segments of it, least ranked first, tried unpinned; one
    that still verifies stays unpinned, one that does not is split, down to single nodes (a ranking that put
    a few of the needed nodes deep costs a few steps, not a pin for every node above them)."""
    dropped: set[int] = set()

    def visit(segment: list[Ranked]) -> None:
        if spent():
            return
        if attempt([r for r in chosen if id(r) not in dropped and r not in segment]):
            dropped.update(id(r) for r in segment)
        elif len(segment) > 1:
            middle = len(segment) // 2
            visit(segment[:middle])
            visit(segment[middle:])

    # the single least-ranked pin first when few (each alone is a step either way), halves when many
    backwards = list(reversed(chosen))
    if len(backwards) <= SINGLES:
        for item in backwards:
            visit([item])
    else:
        middle = len(backwards) // 2
        visit(backwards[:middle])
        visit(backwards[middle:])
    return [r for r in chosen if id(r) not in dropped]


def graph_order_search(graph_order: Sequence[Ranked], trial: Trial) -> Outcome:
    """The baseline (onnxconverter-common's way): the same bisection over the nodes in graph order, without
    the error ranking, and no pruning."""
    return search(graph_order, trial, prune=False)


def describe(item: Ranked) -> str:
    """Why a node was pinned, as a sentence."""
    if item.growth >= NOT_FINITE:
        return "in fp16 its output leaves fp16's range (65504) or turns non-finite where the input model's does not"
    if item.growth > 0:
        return (f"in fp16 it adds {_fmt(item.growth)} x the verification tolerance to the error of its inputs "
                f"(its output is off by {_fmt(item.error)} x the tolerance)")
    return (f"in fp16 it adds no error of its own (its output is off by {_fmt(item.error)} x the tolerance, "
            f"as its inputs are), but the output verifies only with it computed in fp32 too")


def _fmt(x: float) -> str:
    return "inf" if x >= NOT_FINITE else f"{x:.3g}"
