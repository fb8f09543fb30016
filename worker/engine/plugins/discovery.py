"""Where plugins come from: the plugin path, installed packages' entry points, and files named on the CLI.

Plugins are configuration of whoever runs the CLI or the server, read from its environment and command line;
nothing a client sends can name one. Sources are listed in load order, which decides who wins a name clash
(the first) and the order of filters within a priority:

1. ``MIRSERVE_PLUGIN_PATH``: colon-separated entries; a directory contributes its ``*.py`` files in name
   order (files starting with ``_`` or ``.`` are skipped), a ``.py`` file itself;
2. the ``mirserve.plugins`` entry-point group of installed packages, in entry-point name order; an entry
   point names a module (registration on import) or a function (called with no arguments);
3. ``MIRSERVE_PLUGIN_FILES``: the files given with ``--plugin``, which the CLI exports there so that the engine
   processes it starts (a job's child) load them too.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

PATH_VARIABLE = "MIRSERVE_PLUGIN_PATH"
FILES_VARIABLE = "MIRSERVE_PLUGIN_FILES"
ENTRY_POINT_GROUP = "mirserve.plugins"


@dataclass(frozen=True)
class Source:
    """One plugin to load: what the listings call it, how it was found, and how to run it."""

    origin: str  # the file path, or "package NAME VERSION, entry point EP"
    found_by: str  # MIRSERVE_PLUGIN_PATH, entry point, --plugin
    key: str  # identity, so the same plugin found twice loads once
    load: Callable[[], None]
    #: Modules (with their submodules) that are this plugin, forgotten when it is unloaded or fails.
    modules: tuple[str, ...] = ()
    #: A reason the source cannot even be tried (a missing file), reported as its load error.
    problem: str | None = None


def discover(environ: Mapping[str, str] = os.environ) -> Iterator[Source]:
    yield from path_sources(environ.get(PATH_VARIABLE, ""), PATH_VARIABLE)
    yield from entry_point_sources()
    yield from path_sources(environ.get(FILES_VARIABLE, ""), "--plugin")


def path_sources(spec: str, found_by: str) -> Iterator[Source]:
    for entry in spec.split(os.pathsep):
        if not entry.strip():
            continue
        path = Path(entry.strip()).expanduser()
        if path.is_dir():
            for file in sorted(path.glob("*.py")):
                if not file.name.startswith(("_", ".")):
                    yield file_source(file, found_by)
        else:
            yield file_source(path, found_by)


def file_source(path: Path, found_by: str) -> Source:
    path = path.resolve()
    problem = None
    if not path.exists():
        problem = f"{path}: no such file or directory"
    elif path.suffix != ".py" or not path.is_file():
        problem = f"{path}: not a Python file (a plugin is a .py file, or a directory of them)"
    return Source(origin=str(path), found_by=found_by, key=f"file:{path}", load=lambda: import_file(path),
                  modules=(module_name_of(path),), problem=problem)


def module_name_of(path: Path) -> str:
    """A module name of its own for a plugin file (two plugin.py files in two directories do not collide)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"mirserve_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}_{digest}"


def import_file(path: Path) -> types.ModuleType:
    """Execute a plugin file as a module of its own (registered in sys.modules while it runs)."""
    module_name = module_name_of(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def entry_point_sources() -> Iterator[Source]:
    seen: set[str] = set()
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(entry, "dist", None)
        package = f"package {dist.name} {dist.version}" if dist is not None else "an installed package"
        key = f"entry point:{entry.name}={entry.value}"
        if key in seen:  # the same distribution visible twice on sys.path
            continue
        seen.add(key)
        yield Source(origin=f"{package}, entry point {entry.name}", found_by="entry point", key=key,
                     load=_entry_point_loader(entry), modules=(entry.module,))


def _entry_point_loader(entry: importlib.metadata.EntryPoint) -> Callable[[], None]:
    def load() -> None:
        target = entry.load()
        if callable(target) and not isinstance(target, types.ModuleType):
            target()

    return load
