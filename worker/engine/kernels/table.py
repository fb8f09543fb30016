"""The kernel registry: every target's table, loaded once, validated, indexed by (op, domain).

A target's data file is read the first time a lookup names that target (a run for x86 reads x86.json and
host.json, not the four other tables: a sixth of a small model's run time); anything that sees the whole
table (iteration, a plugin's ``add``) reads them all first.

The pass manager asks ``has_kernel`` to decide whether a pass bound to a kernel may run; kernel pick asks
``kernels`` for the candidates of a node at the model's opset. Plugins extend a table through ``add``, which
validates like the loader and refuses an entry that claims a kernel some other origin already registered.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from worker.engine.errors import PlaceError
from worker.engine.kernels.schema import Kernel, KernelTableError, kernel_from_dict
from worker.engine.places import get_target

DATA_DIR = Path(__file__).parent / "data"


class KernelTable:
    def __init__(self) -> None:
        self._by_op: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
        self._by_id: dict[str, Kernel] = {}
        self._sources: dict[str, str] = {}
        #: Data files not read yet, by the target they hold (the file's stem).
        self._pending: dict[str, Path] = {}
        self._lock = threading.RLock()

    def defer_file(self, path: Path) -> None:
        """Read ``path`` (``<target>.json``) when a lookup first names its target."""
        self._pending[Path(path).stem] = Path(path)

    def _load(self, targets: Iterable[str] | None = None) -> None:
        """Read the deferred files of ``targets`` (None: all of them)."""
        if not self._pending:
            return
        with self._lock:
            names = list(self._pending) if targets is None else [t for t in targets if t in self._pending]
            for name in names:
                path = self._pending.pop(name, None)
                if path is not None:
                    self.load_file(path)

    # --- filling -------------------------------------------------------------------------------------
    def add(self, entries: Iterable[Kernel | Mapping[str, Any]], *, origin: str, target: str | None = None,
            source: str | None = None) -> list[Kernel]:
        """Validate ``entries`` and register them all, or none of them.

        ``origin`` names who registers the batch (a data file, a plugin); a mapping entry takes its target
        from ``target`` or its own ``target`` field, and cites its fact in its own ``origin`` field
        (defaulting to ``origin``). An entry that claims the same kernel (target, op, place, variant,
        overlapping opsets) as a registered one, or as another entry of the batch, is refused with both
        origins named.
        """
        self._load()  # a clash with any registered kernel is refused, so all of them must be here
        return self._register(entries, origin=origin, target=target, source=source)

    def _register(self, entries: Iterable[Kernel | Mapping[str, Any]], *, origin: str, target: str | None,
                  source: str | None) -> list[Kernel]:
        kernels = [self._validated(entry, origin, target, index) for index, entry in enumerate(entries)]
        claimed: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
        for kernel in kernels:
            key = (kernel.op, kernel.domain)
            for other in [*self._by_op.get(key, ()), *claimed[key]]:
                if kernel.same_slot(other):
                    raise KernelTableError(
                        f"kernel {kernel.id} from {kernel.registered_by} clashes with kernel {other.id} "
                        f"from {other.registered_by}: both claim {kernel.qualified_op} on {kernel.place_text}")
            claimed[key].append(kernel)
        for kernel in kernels:
            self._by_op[(kernel.op, kernel.domain)].append(kernel)
            self._by_id[kernel.id] = kernel
        if source and target:
            self._sources.setdefault(target, source)
        return kernels

    def _validated(self, entry, origin: str, target: str | None, index: int) -> Kernel:
        if isinstance(entry, Kernel):
            kernel = dataclasses.replace(entry, registered_by=origin)
        else:
            entry_target = entry.get("target", target) if isinstance(entry, Mapping) else target
            if not entry_target:
                raise KernelTableError(f"{origin} entry {index}: no target given")
            kernel = kernel_from_dict(entry, target=entry_target, where=f"{origin} entry {index}",
                                      default_origin=origin, registered_by=origin)
        for name in {kernel.target, *(p.target for p in kernel.inputs + kernel.outputs if p.target)}:
            try:
                get_target(name)
            except PlaceError:
                raise KernelTableError(f"{origin} entry {index}: target {name!r} is not registered; "
                                       f"register it with worker.engine.places.register_target first") from None
        return kernel

    def remove(self, kernel_id: str) -> bool:
        """Drop one kernel (a plugin's, when the plugin is undone); False when there is no such kernel."""
        self._load()
        kernel = self._by_id.pop(kernel_id, None)
        if kernel is None:
            return False
        self._by_op[(kernel.op, kernel.domain)].remove(kernel)
        return True

    def remove_origin(self, origin: str) -> int:
        """Drop every kernel a plugin registered under ``origin``; returns how many."""
        self._load()
        removed = [k.id for k in self._by_id.values() if k.registered_by == origin]
        for kernel_id in removed:
            self.remove(kernel_id)
        return len(removed)

    def load_file(self, path: Path) -> list[Kernel]:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise KernelTableError(f"cannot read kernel table {path}: {exc}") from None
        for key in ("target", "source", "kernels"):
            if key not in data:
                raise KernelTableError(f"kernel table {path} has no {key!r} field")
        with self._lock:
            self._pending.pop(data["target"], None)
            # one target's file: its kernels can only clash with each other (a slot names its target)
            return self._register(data["kernels"], origin=Path(path).name, target=data["target"],
                                  source=data["source"])

    # --- lookups -------------------------------------------------------------------------------------
    def kernels(self, op: str, domain: str = "", *, opset: int | None = None,
                targets: Iterable[str] | None = None) -> list[Kernel]:
        """Candidates for (op, domain), filtered to an opset version and to targets, in table order."""
        wanted = None if targets is None else frozenset(targets)
        self._load(wanted)
        return [k for k in self._by_op.get((op, domain), ())
                if (opset is None or k.covers(opset)) and (wanted is None or k.target in wanted)]

    def has_kernel(self, op_type: str, domain: str, targets: Iterable[str], opset: int | None = None) -> bool:
        """Whether some kernel of this op is registered for one of ``targets`` (at ``opset`` if given)."""
        return bool(self.kernels(op_type, domain, opset=opset, targets=targets))

    def get(self, kernel_id: str) -> Kernel | None:
        self._load([kernel_id.split(":", 1)[0]])  # an id starts with its target
        return self._by_id.get(kernel_id)

    def targets(self) -> list[str]:
        self._load()
        return sorted({k.target for k in self._by_id.values()})

    def by_target(self, target: str) -> list[Kernel]:
        self._load([target])
        return [k for k in self._by_id.values() if k.target == target]

    def source(self, target: str) -> str | None:
        self._load([target])
        return self._sources.get(target)

    def __iter__(self) -> Iterator[Kernel]:
        self._load()
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        self._load()
        return len(self._by_id)


def load_tables(directory: Path = DATA_DIR, *, lazily: bool = False) -> KernelTable:
    """Every ``<target>.json`` of ``directory``; ``lazily``, each read when its target is first looked up."""
    table = KernelTable()
    for path in sorted(Path(directory).glob("*.json")):
        if lazily:
            table.defer_file(path)
        else:
            table.load_file(path)
    return table


@functools.lru_cache(maxsize=1)
def default_table() -> KernelTable:
    """The process-wide table: the committed data files, each read on first use of its target; plugins add
    to it."""
    return load_tables(lazily=True)
