"""What a pass is: metadata that decides when it runs, and a function over a PassContext.

As in Paddle-Lite, a pass has a kind (program passes may change the topology, stmt passes change node state
only, debug passes only read), bound targets and kernels; as in TVM, it has an opt level and no tracing code
of its own: the manager times and counts it, and the pass only reports what it rewrote.
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from worker.ir import Graph, Model
    from worker.options import OptimizeOptions
    from worker.places import ValidPlaces


class PassKind(str, enum.Enum):
    PROGRAM = "program"
    STMT = "stmt"
    DEBUG = "debug"

    def __str__(self) -> str:
        return self.value


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind.value, "description": self.description, "level": self.level,
            "targets": sorted(self.targets) if self.targets is not None else None,
            "excluded_targets": sorted(self.excluded_targets),
            "kernels": [f"{domain}.{op}" if domain else op for op, domain in self.kernels],
            "portable": self.portable, "origin": self.origin,
        }


@dataclass
class PassResult:
    """What a pass did: how many rewrites, which nodes became which, and why candidates were refused."""

    rewrites: int = 0
    details: list[Any] = field(default_factory=list)
    refusals: Counter = field(default_factory=Counter)
    #: Pass-specific figures kept in the trace entry (e.g. values left without a type).
    data: dict[str, Any] = field(default_factory=dict)

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


class KernelLookup(Protocol):
    def has_kernel(self, op_type: str, domain: str, targets) -> bool: ...


@dataclass
class PassContext:
    """Everything a pass may read or annotate; the report collects sections passes add (memory, kernels)."""

    model: "Model"
    options: "OptimizeOptions"
    places: "ValidPlaces"
    kernels: KernelLookup | None = None
    report: dict[str, Any] = field(default_factory=dict)

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
