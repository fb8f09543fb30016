"""Auto mixed precision: the fewest nodes that must compute in fp32 for a model placed on fp16 (or int8) places to
verify.

When verification fails with fp16 places, the failed candidate and the input model run once more, each with
every value of the main graph as an output (``numeric.value_errors``): each value gets its error against the
input's, in units of the verification tolerance. A node's *error growth* is the error of its outputs less the
largest error it was given (through casts, which add none of their own), so a node that merely passes on an
error its producers made ranks low. The nodes computing in fp16 are ranked by growth, and a bisection over
that order finds the shortest prefix that verifies when pinned to fp32 (``PassContext.pinned_fp32``, read by
static_kernel_pick); each step rebuilds the model and verifies it (one runtime run of each model). Then the
pins are tried without, least ranked first (one by one when few, in halves when many), so no pinned node is
there for nothing.

int8 places are searched alike: a quantized model's Conv on an int8 QLinearConv kernel rounds its
accumulator once where the input model computes in float between DequantizeLinear and QuantizeLinear, and a
value on a rounding tie comes out one quantization step apart, which the layers after can grow past the
tolerance (an uncalibrated torchvision ResNet-18 under ``npu/int8/nchw``: 0.07 in the logits). Pinning such a
node keeps it on the fp32 place with its Q/DQ sandwich, which computes what the input does.

Where fp16 fails nearly everywhere (weights that make values grow past fp16's range, as the light model zoo's
constant weights do), the bisection and the unpinning would spend a step on almost every node (Inception v1:
the 40-step cap, 68 of 83 nodes pinned). The traced run also says which values of the input model leave
fp16's range; the nodes that read or write one rank first, as a block, and the first guess after pinning
everything is that block alone. When it verifies, the bisection is over, and the block's pins are not
unpinned by verification but by placement: a pin the plan does not need (a Concat between two pinned
convolutions is placed in fp32 anyway) is one without which the model built is the same model, which takes a
build and no verification (``unchanged``; by op type, within MAX_STEPS builds).

onnxconverter-common's ``auto_mixed_precision`` bisects over the nodes in graph order, blind to where the
error comes from; ``bench/amp.py`` measures both (steps, seconds, nodes pinned).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

from worker.engine.ir import Graph, Node
from worker.engine.passes.place.type_layout_cast import picked_name
from worker.engine.passes.support.casts import is_cast
from worker.engine.places import Precision

#: An error that is not finite (``numeric.NOT_FINITE_ERROR``).
NOT_FINITE = 1e30
#: Up to this many pins, each is tried without its pin on its own (one step each); more, in halves.
SINGLES = 4
#: Unpinning stops once this many of its tries failed and they outnumber the tries that passed ODDS to one.
GIVE_UP, ODDS = 6, 3
#: Steps (a rebuild and a verification each) the search may take: past them, unpinning stops and what
#: verified last is kept (more pins than needed, never a model that does not verify).
MAX_STEPS = 40


@dataclass
class Ranked:
    node: str  # its name when kernel pick ran, which pins it
    op: str
    growth: float  # error made here, in tolerances (outputs' error less the inputs')
    error: float  # the error of its outputs, in tolerances
    beyond_fp16: bool = False  # it reads or writes a value the input model has beyond fp16's range
    precision: str = "fp16"  # the reduced precision it was placed in (fp16, int8)


@dataclass
class Outcome:
    pinned: list[Ranked] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    passed: bool = False
    #: Pins dropped because the model built without them is the same model (no verification needed).
    unneeded: list[Ranked] = field(default_factory=list)
    #: Why unpinning stopped before every pin was tried (then some pins may not be needed), or None.
    stopped: str | None = None
    #: Pins no step showed to be needed (a set without them alone failed), when unpinning stopped early.
    untried: list[Ranked] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.steps)


def reduced_nodes(graph: Graph) -> list[Node]:
    """Compute nodes of the main graph placed to compute in a precision the input model did not: fp16, or int8
    arithmetic where the input computed in float between DequantizeLinear and QuantizeLinear (a Conv on a
    QLinearConv kernel, ``Pick.absorbed``; int8 data moved or (de)quantized as the input model says is not that).
    Casts are not computation."""
    return [n for n in graph if getattr(n, "pick", None) is not None and not is_cast(n)
            and (n.pick.place.precision is Precision.FP16
                 or (n.pick.place.precision is Precision.INT8 and n.pick.absorbed))]


def rank(graph: Graph, errors: dict[str, float], beyond: Collection[str] = ()) -> list[Ranked]:
    """The nodes computing in reduced precision (``reduced_nodes``), most error growth first; ties (and nodes
    whose outputs could not be compared: last) in graph order. Nodes that read or write a value named in
    ``beyond`` (the input model's values beyond fp16's range) come first, in the same order among themselves."""
    memo: dict[str, float] = {}

    def origin(value):
        """The value a cast chain starts from (a cast's output is no value of the input model)."""
        while value is not None and value.producer is not None and is_cast(value.producer) \
                and value.producer.inputs:
            value = value.producer.inputs[0]
        return value

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
    for index, node in enumerate(reduced_nodes(graph)):
        measured = [errors[v.name] for v in node.outputs if v is not None and v.name in errors]
        if not measured:  # only through a cast after it: what the cast's output carries
            measured = [arrived(c.outputs[0]) for v in node.outputs if v is not None for c in v.consumers()
                        if is_cast(c) and c.outputs]
        given = max((arrived(v) for v in node.inputs), default=0.0)
        error = max(measured, default=0.0)
        growth = 0.0 if given >= NOT_FINITE else max(error - given, 0.0)
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        touched = {getattr(origin(v), "name", None) for v in (*node.inputs, *node.outputs) if v is not None}
        out_of_range = bool(beyond) and not touched.isdisjoint(beyond)
        ranked.append((not out_of_range, not measured, -growth, -error, index,
                       Ranked(picked_name(node), op, growth, error, out_of_range, str(node.pick.place.precision))))
    ranked.sort(key=lambda item: item[:5])
    return [item[5] for item in ranked]


Trial = Callable[[Sequence[str]], "tuple[bool, str]"]
#: ``unchanged(pins, fewer)``: the model built with the pins ``fewer`` is the one built with ``pins``.
Unchanged = Callable[[Sequence[str], Sequence[str]], bool]


def search(order: Sequence[Ranked], trial: Trial, *, prune: bool = True, seconds: float | None = None,
           unchanged: Unchanged | None = None) -> Outcome:
    """The shortest prefix of ``order`` that verifies when pinned (``trial(names)`` -> passed, what it found),
    then each of its nodes tried without its pin (when ``prune``). Assumes pinning more never hurts. After
    ``seconds`` (or MAX_STEPS steps) no new step starts: the set that verified last is kept.

    The leading nodes that touch values beyond fp16's range (``Ranked.beyond_fp16``) are the first guess: when
    pinning them verifies, they are kept but for the pins ``unchanged`` finds make no difference (by builds,
    without verification), and only the nodes after them are bisected and unpinned."""
    outcome = Outcome()
    deadline = None if seconds is None else time.perf_counter() + seconds

    def spent() -> bool:
        return len(outcome.steps) >= MAX_STEPS or (deadline is not None and time.perf_counter() > deadline)

    # pin sets seen to fail: fewer pins than one of them fail too (pinning more never hurts), so the unpinning
    # phase does not verify what the bisection already showed (a prefix that failed has no pin of the node
    # after it: every set without that node fails)
    failed: list[frozenset[str]] = []

    def attempt(chosen: Sequence[Ranked]) -> bool | None:
        """Whether the model verifies with ``chosen`` pinned; None when a set seen to fail holds them all."""
        names = frozenset(r.node for r in chosen)
        if any(names <= seen for seen in failed):
            return None
        started = time.perf_counter()
        passed, found = trial([r.node for r in chosen])
        outcome.steps.append({"pinned": len(chosen), "passed": passed, "found": found,
                              "seconds": round(time.perf_counter() - started, 3)})
        if not passed:
            failed.append(names)
        return passed

    if not order or not attempt(order):
        return outcome
    low, high = 0, len(order)  # prefix low fails (the first build: no pins), prefix high passes
    block = next((i for i, r in enumerate(order) if not r.beyond_fp16), len(order))
    if block and prune and unchanged is not None:  # the first guess: the nodes beyond fp16's range
        if block == len(order) or attempt(order[:block]):
            low, high = block - 1, block
        else:
            low = block
    while high - low > 1 and not spent():
        middle = (low + high) // 2
        if attempt(order[:middle]):
            high = middle
        else:
            low = middle
    chosen = list(order[:high])
    if block and prune and unchanged is not None:
        kept = _needed_by_placement(chosen[:block], chosen, unchanged)
        outcome.unneeded = [r for r in chosen[:block] if r not in kept]
        fixed, chosen = kept, chosen[block:]
    else:
        fixed = []
    if prune and len(chosen) > 1:
        chosen, outcome.stopped = _unpin(chosen, lambda pins: attempt([*fixed, *pins]), spent)
    outcome.pinned, outcome.passed = [*fixed, *chosen], True
    if outcome.stopped:
        pins = frozenset(r.node for r in chosen)
        outcome.untried = [r for r in chosen if not any(pins - {r.node} <= seen for seen in failed)]
    return outcome


def _needed_by_placement(candidates: list[Ranked], chosen: list[Ranked], unchanged: Unchanged) -> list[Ranked]:
    """``candidates`` (part of ``chosen``) less the pins without which ``chosen`` builds the same model. The
    pins go by op type, smallest groups first (the plan places a Concat or a pooling between pinned nodes in
    fp32 of its own accord, and all of a type alike): a group whose pins all go without changing the model
    goes, one that changes it is split, down to single pins, within MAX_STEPS builds. Builds only: the model
    verified is the model kept."""
    names = [r.node for r in chosen]
    dropped: set[str] = set()
    builds = 0

    def visit(segment: list[Ranked]) -> None:
        nonlocal builds
        if builds >= MAX_STEPS:
            return
        builds += 1
        without = {r.node for r in segment}
        if unchanged(names, [n for n in names if n not in dropped and n not in without]):
            dropped.update(without)
        elif len(segment) > 1:
            middle = len(segment) // 2
            visit(segment[:middle])
            visit(segment[middle:])

    groups: dict[str, list[Ranked]] = {}
    for item in reversed(candidates):  # least ranked first within a group
        groups.setdefault(item.op, []).append(item)
    for group in sorted(groups.values(), key=len):
        visit(group)
    return [r for r in candidates if r.node not in dropped]


def _unpin(chosen: list[Ranked], attempt: Callable[[Sequence[Ranked]], "bool | None"],
           spent: Callable[[], bool]) -> tuple[list[Ranked], str | None]:
    """``chosen`` less the pins it verifies without, and why unpinning stopped early (None: it did not):
    segments of it, least ranked first, tried unpinned; one that still verifies stays unpinned, one that does
    not is split, down to single nodes (a ranking that put a few of the needed nodes deep costs a few steps,
    not a pin for every node above them). ``attempt`` answers None for a set known to fail without a step.

    The segments go level by level (both halves, then the four quarters, ...), so where the needed pins
    cluster at one end the other end's segments pass early. Where they do not pass, the pins are nearly all
    needed: fp16's error is rounding spread over many nodes, each adding a little, and proving that of every
    pin takes a verification each (the cap, 40 steps, and a few pins saved on DeepLabV3). So once the tries
    that failed reach GIVE_UP and outnumber those that passed ODDS to one, unpinning stops and keeps the pins
    it has: more pins than the fewest, in few steps."""
    dropped: set[int] = set()
    passed = failed = 0
    # the single least-ranked pins first when few (each alone is a step either way), halves when many
    backwards = list(reversed(chosen))
    middle = len(backwards) // 2
    queue = [[item] for item in backwards] if len(backwards) <= SINGLES else [backwards[:middle], backwards[middle:]]
    while queue:
        if spent():
            return [r for r in chosen if id(r) not in dropped], "its steps or time ran out"
        if failed >= GIVE_UP and failed > ODDS * passed:
            return [r for r in chosen if id(r) not in dropped], (
                f"{failed} of {failed + passed} tries to unpin failed: the error is spread over the pinned nodes")
        segment = queue.pop(0)
        verified = attempt([r for r in chosen if id(r) not in dropped and r not in segment])
        if verified:
            dropped.update(id(r) for r in segment)
            passed += 1
            continue
        failed += verified is not None  # a set known to fail took no step
        if len(segment) > 1:
            half = len(segment) // 2
            queue += [segment[:half], segment[half:]]
    return [r for r in chosen if id(r) not in dropped], None


def graph_order_search(graph_order: Sequence[Ranked], trial: Trial) -> Outcome:
    """The baseline (onnxconverter-common's way): the same bisection over the nodes in graph order, without
    the error ranking, and no pruning."""
    return search(graph_order, trial, prune=False)


def rank_weights(graph: Graph, stored: dict[str, str], errors: dict[str, float]) -> list[Ranked]:
    """The weights fp16_storage stored (``stored``: each fp16 initializer's name -> the weight's), the most
    error their readers add first: a reader's growth is the error of its outputs less the largest its other
    inputs carry (read through the calib that widens the weight; ties in storing order). Ranked.node is the
    weight's name, which ``PassContext.kept_fp32_weights`` takes."""
    ranked = []
    for index, (half_name, weight) in enumerate(stored.items()):
        half = graph.initializers.get(half_name)
        if half is None:
            continue
        widened, readers = {half.name}, []
        frontier = [half]
        while frontier:  # through the calibs to the nodes that compute with the weight
            value = frontier.pop()
            for node in value.consumers():
                if is_cast(node):
                    widened.update(v.name for v in node.outputs if v is not None)
                    frontier.extend(v for v in node.outputs if v is not None)
                else:
                    readers.append(node)
        growth = error = 0.0
        for node in readers:
            out = max((errors[v.name] for v in node.outputs if v is not None and v.name in errors), default=0.0)
            given = max((errors[v.name] for v in node.inputs if v is not None and v.name not in widened
                         and v.name in errors), default=0.0)
            error = max(error, out)
            growth = max(growth, 0.0 if given >= NOT_FINITE else out - given)
        ranked.append((-growth, -error, index, Ranked(weight, "weight", growth, error)))
    ranked.sort(key=lambda item: item[:3])
    return [item[3] for item in ranked]


def describe_weight(item: Ranked) -> str:
    """Why a weight was kept in fp32, as a sentence."""
    if item.growth >= NOT_FINITE:
        return "stored in fp16 it turns a reader's output non-finite where the input model's is not"
    if item.growth > 0:
        return (f"the output verifies only with it in fp32 (stored in fp16 it adds {_fmt(item.growth)} x the "
                f"verification tolerance to the error of a node reading it)")
    return "its readers add no error of their own in fp16, but the output verifies only with it kept in fp32"


def describe(item: Ranked, untried: bool = False) -> str:
    """Why a node was pinned, as a sentence; ``untried``: unpinning stopped before it was tried without its pin
    (``Outcome.untried``)."""
    where = f"in {item.precision}"
    if untried:
        return (f"{where} its output is off by {_fmt(item.error)} x the verification tolerance; kept in fp32 "
                f"without being tried {where} alone, as unpinning stopped early (the error is spread over many "
                f"nodes, so nearly every pin is needed)")
    if item.beyond_fp16:
        return ("it reads or writes values beyond fp16's range (65504) in the input model: kept in fp32 with the "
                "other nodes that do, as the placement needs it (not verified without it alone)")
    if item.growth >= NOT_FINITE:
        return f"{where} its output leaves fp16's range (65504) or turns non-finite where the input model's does not"
    if item.growth > 0:
        return (f"{where} it adds {_fmt(item.growth)} x the verification tolerance to the error of its inputs "
                f"(its output is off by {_fmt(item.error)} x the tolerance)")
    return (f"{where} it adds no error of its own (its output is off by {_fmt(item.error)} x the tolerance, "
            f"as its inputs are), but the output verifies only with it computed in fp32 too")


def _fmt(x: float) -> str:
    return "inf" if x >= NOT_FINITE else f"{x:.3g}"
