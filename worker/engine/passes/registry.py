"""The one registry of passes: built-in passes register on import, plugins register through the same door."""
from __future__ import annotations

from typing import Iterable, Iterator

from worker.engine.origin import current_origin, registering_as
from worker.engine.passes.base import Analysis, Pass, PassFunction, PassInfo, PassKind


class PassRegistry:
    def __init__(self) -> None:
        self._passes: dict[str, Pass] = {}

    def __iter__(self) -> Iterator[Pass]:
        return iter(self._passes.values())

    def __contains__(self, name: str) -> bool:
        return name in self._passes

    def __len__(self) -> int:
        return len(self._passes)

    def get(self, name: str) -> Pass:
        try:
            return self._passes[name]
        except KeyError:
            raise KeyError(f"unknown pass {name!r}") from None

    def names(self) -> list[str]:
        return list(self._passes)

    def origin(self, origin: str):
        """Attribute every registration made inside the block to ``origin`` (see ``worker.engine.origin``)."""
        return registering_as(origin)

    @property
    def current_origin(self) -> str:
        return current_origin()

    def add(self, info: PassInfo, run: PassFunction) -> Pass:
        existing = self._passes.get(info.name)
        if existing is not None:
            raise ValueError(f"pass {info.name!r} from {info.origin} clashes with the pass of the same name "
                             f"from {existing.info.origin}")
        registered = Pass(info, run)
        self._passes[info.name] = registered
        return registered

    def remove(self, name: str) -> None:
        self._passes.pop(name, None)


REGISTRY = PassRegistry()


def register_pass(*, name: str, kind: PassKind | str, description: str, level: int = 1,
                  targets: Iterable[str] | None = None, excluded_targets: Iterable[str] = (),
                  kernels: Iterable[tuple[str, str] | str] = (), portable: bool = True,
                  invalidates: Iterable[Analysis | str] | None = None,
                  requires: Iterable[Analysis | str] | None = None, peer: str | None = None,
                  registry: PassRegistry | None = None):
    """Decorator registering a pass function ``fn(ctx) -> PassResult | None`` under ``name``.

    ``kernels`` lists (op_type, domain) pairs, or "domain.op" / "op" strings. ``peer`` names the optimizer
    whose pass this one reproduces (``PassInfo.peer``). ``invalidates`` defaults to the
    topological order for program passes (they may add nodes anywhere) and nothing for the others;
    ``requires`` defaults to types and order.
    """
    registry = REGISTRY if registry is None else registry
    if not description or "\n" in description:
        raise ValueError(f"pass {name!r} needs a one-line description")

    def decorate(fn: PassFunction) -> PassFunction:
        info = PassInfo(name=name, kind=PassKind(kind), description=description, level=level,
                        targets=frozenset(targets) if targets is not None else None,
                        excluded_targets=frozenset(excluded_targets),
                        kernels=tuple(_kernel_key(k) for k in kernels), portable=portable,
                        origin=registry.current_origin, peer=peer, **analyses(PassKind(kind), invalidates, requires))
        registry.add(info, fn)
        return fn

    return decorate


def analyses(kind: PassKind, invalidates: Iterable[Analysis | str] | None,
             requires: Iterable[Analysis | str] | None) -> dict[str, frozenset[Analysis]]:
    """The ``invalidates`` and ``requires`` fields of a PassInfo, defaults filled in by kind."""
    found = {}
    if invalidates is not None:
        found["invalidates"] = frozenset(Analysis(a) for a in invalidates)
    elif kind is PassKind.PROGRAM:
        found["invalidates"] = frozenset({Analysis.ORDER})
    if requires is not None:
        found["requires"] = frozenset(Analysis(a) for a in requires)
    return found


def _kernel_key(kernel: tuple[str, str] | str) -> tuple[str, str]:
    if isinstance(kernel, tuple):
        return kernel
    domain, _, op = kernel.rpartition(".")
    return op, domain
