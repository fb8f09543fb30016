"""Loading plugins: each one all or nothing, attributed to its origin, its failure kept for the listings.

A plugin runs inside the pass registry's ``origin()`` context, so everything it registers carries its origin.
The registries are compared before and after: what is new is what the plugin provides. If the plugin raises
(an import error, a name clash, a bad registration) or registers something that does not carry its origin,
everything new is removed again, and the plugin is recorded as failed with its error: the CLI and the service
go on without it, the listings show the error, and a run that asks for one of its names fails with it.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import worker
from worker.engine import places
from worker.engine.mirserve_domain import ops as domain
from worker.engine.kernels import default_table
from worker.engine.kernels.cost import unregister_target_cost
from worker.engine.origin import registering_as
from worker.engine.passes import pipelines
from worker.engine.passes.registry import REGISTRY
from worker.engine.plugins.discovery import FILES_VARIABLE, Source, discover, path_sources
from worker.engine.plugins.filters import FILTERS


@dataclass
class PluginRecord:
    origin: str
    found_by: str
    status: str  # "loaded" or "failed"
    error: str | None = None
    #: kind (passes, filters, pipelines, targets, ops, kernels) -> names (kernel ids) it registered or tried to.
    provides: dict[str, list[str]] = field(default_factory=dict)
    modules: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "found_by": self.found_by, "status": self.status, "error": self.error,
                "provides": {kind: list(names) for kind, names in self.provides.items() if names}}


def _registered() -> dict[str, dict[str, str]]:
    """Every registry: kind -> name -> origin."""
    return {
        "passes": {p.name: p.info.origin for p in REGISTRY},
        "filters": {f.name: f.info.origin for f in FILTERS},
        "pipelines": {p.name: p.origin for p in pipelines.all_pipelines()},
        "targets": {t.name: t.origin for t in places.all_targets()},
        "ops": {o.name: o.origin for o in domain.all_ops()},
        "kernels": {k.id: k.registered_by for k in default_table()},
    }


_THROUGH = {"pipelines": "register_pipeline or pipeline_builder", "targets": "register_target",
            "ops": "register_op", "kernels": "register_kernels"}


_UNREGISTER = {"passes": REGISTRY.remove, "filters": FILTERS.remove,
               "pipelines": lambda name: pipelines.unregister_pipeline(name, force=True),
               "targets": lambda name: (places.unregister_target(name, force=True), unregister_target_cost(name)),
               "ops": lambda name: domain.unregister_op(name, force=True),
               "kernels": lambda kernel_id: default_table().remove(kernel_id)}


def _remove(kind: str, name: str) -> None:
    """Undo one registration through its registry's own hook. Only names the plugin's load created reach
    here (a before/after comparison), so even one that claims to be built-in is removed."""
    _UNREGISTER[kind](name)


def _forget(provides: dict[str, list[str]], modules: Iterable[str]) -> None:
    """Remove what a plugin registered, and its modules, so that loading it again runs it again."""
    for kind, names in provides.items():
        for name in names:
            _remove(kind, name)
    for module in modules:
        for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            del sys.modules[name]


class Plugins:
    """The process's plugin table: what was loaded from where, and what failed with which error."""

    def __init__(self) -> None:
        self.records: list[PluginRecord] = []
        self._keys: set[str] = set()
        self._environment_loaded = False
        self._lock = threading.RLock()

    def ensure_loaded(self) -> None:
        """Load the plugins the environment names, once per process (later calls return at once)."""
        with self._lock:
            if self._environment_loaded:
                return
            self._environment_loaded = True
            for source in discover(os.environ):
                self.load(source)

    def add_files(self, paths: Iterable[str | os.PathLike]) -> None:
        """Plugins given with ``--plugin``: exported for engine child processes, loaded here (now or later)."""
        resolved = [str(Path(p).expanduser().resolve()) for p in paths]
        entries = [e for e in os.environ.get(FILES_VARIABLE, "").split(os.pathsep) if e]
        os.environ[FILES_VARIABLE] = os.pathsep.join(entries + [p for p in resolved if p not in entries])
        with self._lock:
            if self._environment_loaded:
                for source in path_sources(os.pathsep.join(resolved), "--plugin"):
                    self.load(source)

    def load(self, source: Source) -> PluginRecord | None:
        """Load one source, all or nothing; None when it was loaded already."""
        with self._lock:
            if source.key in self._keys:
                return None
            self._keys.add(source.key)
            record = PluginRecord(source.origin, source.found_by, "loaded", modules=source.modules)
            if source.problem is not None:
                record.status, record.error = "failed", source.problem
            else:
                self._run(source, record)
            self.records.append(record)
            return record

    def _run(self, source: Source, record: PluginRecord) -> None:
        before = _registered()
        error = None
        try:
            with registering_as(source.origin):
                source.load()
        except (Exception, SystemExit) as exc:  # a plugin must not take the CLI or the service down
            error = describe(exc, source.origin if source.key.startswith("file:") else None)
        after = _registered()
        new = {kind: [n for n in names if n not in before[kind]] for kind, names in after.items()}
        record.provides = {kind: names for kind, names in new.items() if names}
        if error is None:
            error = _unattributed(new, after, source.origin) or _pass_named_like_a_filter(new, before)
        if error is not None:
            _forget(new, source.modules)
            record.status, record.error = "failed", error

    def unload_all(self) -> None:
        """Remove everything every plugin registered and forget them (tests; a fresh start)."""
        with self._lock:
            for record in reversed(self.records):
                if not record.failed:
                    _forget(record.provides, record.modules)
            self.records.clear()
            self._keys.clear()
            self._environment_loaded = False

    def failures(self) -> list[PluginRecord]:
        return [r for r in self.records if r.failed]

    def why_missing(self, kind: str, name: str) -> str | None:
        """The error of the failed plugin that provided (or tried to) ``name``, as a clause; None if unknown."""
        for record in self.failures():
            if name in record.provides.get(kind, ()):
                return f"it comes from plugin {record.origin}, which failed to load: {record.error}"
        failed = self.failures()
        if failed:
            listed = "; ".join(f"{r.origin}: {r.error}" for r in failed)
            return f"{'a plugin' if len(failed) == 1 else 'plugins'} that failed to load may provide it ({listed})"
        return None


def _unattributed(new: dict[str, list[str]], after: dict[str, dict[str, str]], origin: str) -> str | None:
    for kind, names in new.items():
        for name in names:
            if after[kind][name] != origin:
                singular = kind[:-1]
                return (f"it registered {singular} {name!r} with origin {after[kind][name]!r}; register it through "
                        f"worker.engine.plugins.{_THROUGH.get(kind, 'register_' + singular)} so that it names this plugin")
    return None


_ENGINE = Path(worker.__file__).resolve().parent
def _pass_named_like_a_filter(new: dict[str, list[str]], before: dict[str, dict[str, str]]) -> str | None:
    """Passes and filters share one namespace; the pass registry itself does not know about filters."""
    for name in new["passes"]:
        if name in before["filters"]:
            return (f"ValueError: pass {name!r} from {REGISTRY.get(name).info.origin} clashes with the filter of "
                    f"the same name from {before['filters'][name]}")
    return None


_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()
_SITE = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}


def _is_plugin_code(path: Path) -> bool:
    """Not the engine's code and not the standard library's (site-packages may sit inside the latter)."""
    if path.is_relative_to(_ENGINE):
        return False
    return not path.is_relative_to(_STDLIB) or any(path.is_relative_to(site) for site in _SITE)


def describe(exc: BaseException, plugin_file: str | None = None) -> str:
    """One line for a plugin's failure, with the innermost line of plugin code it happened at.

    Plugin code is ``plugin_file`` when the plugin is a file, else anything but the engine and the stdlib.
    """
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    where = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        if filename.startswith("<"):
            continue
        path = Path(filename).resolve()
        if (str(path) == plugin_file) if plugin_file else _is_plugin_code(path):
            where = f"{filename}:{line}"
    return f"{text} (at {where})" if where else text


PLUGINS = Plugins()
ensure_loaded: Callable[[], None] = PLUGINS.ensure_loaded
