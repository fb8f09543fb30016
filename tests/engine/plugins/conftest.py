"""Every plugin test starts and ends with no plugin loaded and no plugin variable set."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from worker.engine.plugins.discovery import FILES_VARIABLE, PATH_VARIABLE
from worker.engine.plugins.loader import PLUGINS

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plugins"


@pytest.fixture(autouse=True)
def no_plugins(monkeypatch):
    monkeypatch.setenv(PATH_VARIABLE, "")
    monkeypatch.setenv(FILES_VARIABLE, "")
    PLUGINS.unload_all()
    yield
    PLUGINS.unload_all()


def write_plugin(directory: Path, name: str, source: str) -> Path:
    """A plugin file ``name`` in ``directory`` with ``source`` (dedented)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def load_path(monkeypatch, *entries) -> list[dict]:
    """Point MIRSERVE_PLUGIN_PATH at ``entries``, load, and return the plugin records."""
    monkeypatch.setenv(PATH_VARIABLE, ":".join(str(e) for e in entries))
    PLUGINS.ensure_loaded()
    return [r.to_dict() for r in PLUGINS.records]
