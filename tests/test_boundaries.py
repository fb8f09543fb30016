"""The contract between the three packages, read from the source of every module (nested imports included):

- ``worker.engine`` (the optimizer library) imports neither ``worker.jobs`` nor ``app``;
- ``worker.jobs`` (the job process) imports only ``worker.engine.api`` and ``worker.engine.errors`` of the engine;
- ``app`` (the HTTP API) imports only ``worker.engine.api`` of the engine and only the public surface of
  ``worker.jobs`` (the names its ``__all__`` lists).
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
JOBS_MAY_IMPORT = {"worker.engine.api", "worker.engine.errors"}


@dataclass(frozen=True)
class Imported:
    module: str         # the module that imports
    target: str         # the module imported
    names: tuple        # for ``from target import a, b``: ("a", "b"); empty for ``import target``
    line: int

    def __str__(self) -> str:
        what = f"from {self.target} import {', '.join(self.names)}" if self.names else f"import {self.target}"
        return f"{self.module}:{self.line}: {what}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache  # each test reads every module of a package: parse each once
def imports_of(path: Path) -> list[Imported]:
    return imports_in(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")


def imports_in(source: str, name: str, is_package: bool = False) -> list[Imported]:
    """Every import statement anywhere in the source: module level, in functions, under TYPE_CHECKING."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Imported(name, alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:  # relative: resolve against the importing package
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join([*base, target] if target else base)
            found.append(Imported(name, target, tuple(a.name for a in node.names), node.lineno))
    return found


def package_imports(package: str) -> list[Imported]:
    files = sorted((REPO / package.replace(".", "/")).rglob("*.py"))
    assert files, f"no modules found for {package}"
    return [i for path in files for i in imports_of(path)]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_engine_imports_neither_the_job_side_nor_the_api():
    wrong = [str(i) for i in package_imports("worker.engine") if within(i.target, "worker.jobs")
             or within(i.target, "app") or (i.target == "worker" and "jobs" in i.names)]
    assert wrong == []


def test_the_job_side_uses_only_the_engines_api_and_errors():
    wrong = []
    for imported in package_imports("worker.jobs"):
        if imported.target == "worker.engine":  # from worker.engine import api
            if not {f"worker.engine.{n}" for n in imported.names} <= JOBS_MAY_IMPORT:
                wrong.append(str(imported))
        elif within(imported.target, "worker.engine") and imported.target not in JOBS_MAY_IMPORT:
            wrong.append(str(imported))
        elif within(imported.target, "app"):
            wrong.append(str(imported))
    assert wrong == []


def test_the_api_uses_only_the_engines_api_and_the_job_sides_public_surface():
    import worker.jobs

    public = set(worker.jobs.__all__)
    wrong = []
    for imported in package_imports("app"):
        if not within(imported.target, "worker"):
            continue
        if imported.target == "worker.engine.api":
            continue
        if imported.target == "worker.jobs" and imported.names and set(imported.names) <= public:
            continue
        wrong.append(str(imported))
    assert wrong == []


def test_the_job_sides_public_surface_resolves_and_loads_lazily():
    import subprocess
    import sys

    import worker.jobs

    for name in worker.jobs.__all__:
        assert getattr(worker.jobs, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        worker.jobs.nothing  # noqa: B018
    # An engine process imports worker.jobs.child: the package must not drag in the database and queue.
    probe = ("import sys, worker.jobs.child; "
             "print(sorted(m for m in ('sqlalchemy', 'huey', 'fastapi', 'app') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize("source, expected", [
    ("import worker.jobs.store\n", [("worker.jobs.store", ())]),
    ("def f():\n    from worker.engine.passes import REGISTRY\n", [("worker.engine.passes", ("REGISTRY",))]),
    ("from . import store\n", [("worker.jobs", ("store",))]),
    ("from ..engine import api\n", [("worker.engine", ("api",))]),
])
def test_the_reader_sees_nested_and_relative_imports(source, expected):
    assert [(i.target, i.names) for i in imports_in(source, "worker.jobs.probe")] == expected
