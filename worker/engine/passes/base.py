"""What a pass is: metadata that decides when it runs, and a function over a PassContext.

As in Paddle-Lite, a pass has a kind (program passes may change the topology, stmt passes change node state
only, debug passes only read), bound targets and kernels; as in TVM, it has an opt level and no tracing code
of its own: the manager times and counts it, and the pass only reports what it rewrote. As in MLIR's
analysis manager, a pass declares which analyses of the graph it may invalidate and which it requires, and
the manager restores them (type inference, topological order) as steps of its own: no pass runs another.
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from worker.engine.ir import Graph, Model
    from worker.engine.kernels import KernelTable
    from worker.engine.options import OptimizeOptions
    from worker.engine.places import Place, ValidPlaces


class PassKind(str, enum.Enum):
    PROGRAM = "program"
    STMT = "stmt"
    DEBUG = "debug"

    def __str__(self) -> str:
        return self.value


class Analysis(str, enum.Enum):
    """Facts about the graph that passes rely on and the manager keeps up to date."""

    #: Every value's dtype and shape as type inference gives them (the ``type_inference`` pass).
    TYPES = "types"
    #: Nodes listed in topological order (restored by a topological sort).
    ORDER = "order"

    def __str__(self) -> str:
        return self.value


#: The optimizers whose passes built-in passes reproduce (see each pass's docstring for which pass).
PEERS = ("onnxoptimizer", "onnxruntime", "Paddle-Lite", "ncnn", "NNVM")


@dataclass(frozen=True)
class PassInfo:
    name: str
    kind: PassKind
    description: str
    #: 0: analysis only; 1: eliminations, folding, fusions into standard ops; 2: own-domain ops, replacements.
    level: int = 1
    #: Targets the pass is for (None: any target).
    targets: frozenset[str] | None = None
    excluded_targets: frozenset[str] = frozenset()
    #: (op_type, domain) kernels that must be registered for some valid target.
    kernels: tuple[tuple[str, str], ...] = ()
    #: False for passes that emit ops of the project's own domain (skipped with --portable).
    portable: bool = True
    origin: str = "built-in"
    #: Analyses the pass may leave stale when it rewrites something (it can say it kept one: PassResult).
    invalidates: frozenset[Analysis] = frozenset()
    #: Analyses that must hold when the pass starts; the manager restores a stale one first.
    requires: frozenset[Analysis] = frozenset({Analysis.TYPES, Analysis.ORDER})
    #: The optimizer whose pass this one reproduces, under its name or one a user of it recognises
    #: (one of ``PEERS`` for built-in passes); None for a pass of mirserve's own.
    peer: str | None = None

    def to_dict(self, *, analyses: bool = True) -> dict[str, Any]:
        """The listing of ``mirserve passes``; ``analyses`` False for plugin filters, which a stage runs (and
        which reproduce no peer's pass)."""
        data = {
            "name": self.name, "kind": self.kind.value, "description": self.description, "level": self.level,
            "targets": sorted(self.targets) if self.targets is not None else None,
            "excluded_targets": sorted(self.excluded_targets),
            "kernels": [f"{domain}.{op}" if domain else op for op, domain in self.kernels],
            "portable": self.portable, "origin": self.origin,
        }
        if analyses:
            data.update(invalidates=sorted(a.value for a in self.invalidates),
                        requires=sorted(a.value for a in self.requires), peer=self.peer)
        return data


@dataclass
class PassResult:
    """What a pass did: how many rewrites, which nodes became which, and why candidates were refused."""

    rewrites: int = 0
    details: list[Any] = field(default_factory=list)
    refusals: Counter = field(default_factory=Counter)
    #: Pass-specific figures kept in the trace entry (e.g. values left without a type).
    data: dict[str, Any] = field(default_factory=dict)
    #: Analyses the pass declares it may invalidate but kept valid on this run (MLIR's markPreserved).
    preserved: set[Analysis] = field(default_factory=set)
    #: Analyses this run left stale beyond those the pass declares (``invalidate``).
    invalidated: set[Analysis] = field(default_factory=set)

    def preserve(self, *analyses: Analysis) -> None:
        """Say that this run left ``analyses`` valid although the pass declares it may invalidate them."""
        self.preserved.update(analyses)

    def invalidate(self, *analyses: Analysis) -> None:
        """Say that this run left ``analyses`` stale although the pass does not declare it may (a rule whose
        readers now read a value whose shape is better known than the one they read: inferred again, their
        types may be too)."""
        self.invalidated.update(analyses)

    def rewrote(self, detail: Any = None, count: int = 1) -> None:
        self.rewrites += count
        if detail is not None:
            self.details.append(detail)

    def refused(self, reason: str) -> None:
        self.refusals[reason] += 1

    def merge(self, other: "PassResult") -> None:
        self.rewrites += other.rewrites
        self.details.extend(other.details)
        self.refusals.update(other.refusals)
        self.data.update(other.data)
        self.invalidated.update(other.invalidated)


def _default_kernels() -> "KernelTable":
    from worker.engine.kernels import default_table

    return default_table()


@dataclass
class PassContext:
    """Everything a pass may read or annotate; the report collects sections passes add (memory, kernels)."""

    model: "Model"
    options: "OptimizeOptions"
    places: "ValidPlaces"
    #: The kernel tables of this run: the only source of kernels a pass reads.
    kernels: "KernelTable | None" = field(default_factory=_default_kernels)
    report: dict[str, Any] = field(default_factory=dict)
    #: The place each graph output must leave in, by output name (the fetch contract; see place passes).
    fetch_places: dict[str, "Place"] = field(default_factory=dict)
    #: Input shapes for the dims the user left open (``numeric.choose_shapes``'s answer: ``shapes``, the
    #: sets verification runs, the first of which the memory plan plans at; ``dims``; ``roles``), or None.
    sample_shapes: dict[str, Any] | None = None
    #: Bytes of the input model file: the optimized model's weights may grow to ``limits.output_limit`` of it
    #: (None, for a model that came from no file: only the folding budget applies).
    input_bytes: int | None = None
    #: Names of nodes that must not compute in fp16 (auto mixed precision pins them after verification failed
    #: in fp16): kernel pick drops their fp16 candidates, taking fp16 inputs in fp32 through a calib.
    pinned_fp32: frozenset[str] = frozenset()
    #: Names of weights fp16_storage keeps in fp32 (its fallback keeps them after verification failed with
    #: every weight stored in fp16).
    kept_fp32_weights: frozenset[str] = frozenset()
    #: What fp16_storage stored: each fp16 initializer's name -> the name of the fp32 weight it replaced.
    stored_half: dict[str, str] = field(default_factory=dict)
    #: Names of values the input model declares fp16 that their kernel computes in fp32 (recorded by
    #: variable_place_inference as it changes their dtype): they hold what fp16 would have rounded, so a
    #: consumer whose result is no longer widened (a Cast, a comparison) reads them rounded to fp16 first.
    widened: set[str] = field(default_factory=set)
    #: The passes the manager was asked to run in this run, in order (a pass may ask whether a later one,
    #: such as kernel pick, will run; ``skip_reason`` says whether it would be skipped).
    planned_passes: tuple[str, ...] = ()
    #: What a pass may keep between builds of one model from the same start (auto mixed precision's steps,
    #: ``worker.engine.pinned_builds``, share it), by the pass's name: only what depends on nothing the builds
    #: differ in (kernel pick's rankings of node facts, its fp16 range check of each weight).
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def graph(self) -> "Graph":
        return self.model.graph

    def opset(self, domain: str = "") -> int:
        return self.model.opset(domain)


PassFunction = Callable[[PassContext], "PassResult | None"]


@dataclass(frozen=True)
class Pass:
    info: PassInfo
    run: PassFunction

    @property
    def name(self) -> str:
        return self.info.name
