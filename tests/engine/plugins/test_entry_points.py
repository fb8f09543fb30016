"""Plugins from installed packages: a throw-away package really installed by pip, found by its entry points.

The package is a wheel built here (a zip with its .dist-info: METADATA, WHEEL, entry_points.txt, RECORD) and
installed with ``pip install --target``, offline and without a build backend: pip writes the installed
.dist-info exactly as it does for any package, so discovery reads what a real installation leaves, and the
test needs neither the network nor setuptools in the venv (CI's venv has neither at test time).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from worker.engine.api import list_all, validate_options
from worker.engine.options import OptimizeOptions
from worker.engine.plugins.filters import FILTERS
from worker.engine.plugins.loader import PLUGINS

PACKAGE = "mirserve_demo_plugin"
FILES = {
    f"{PACKAGE}/__init__.py": '''
        """Registers when its entry point function is called, not on import."""
        from worker.engine.plugins import pipeline_builder, register_filter


        def register():
            @register_filter("Relu", priority=130, description="looks at every Relu")
            def demo_relu_watch(ctx, node):
                return False

            @pipeline_builder(name="demo_pipeline", description="type inference, then the PRE filters")
            def demo_pipeline(options):
                return ["type_inference", "filter_pre"]
        ''',
    f"{PACKAGE}/on_import.py": '''
        """Registers on import: an entry point may name a module."""
        from worker.engine.plugins import register_target

        register_target("demo_npu", description="a target from an installed package")
        ''',
    f"{PACKAGE}/broken.py": '''
        raise RuntimeError("the demo package's broken entry point")
        ''',
}
DIST_INFO = "mirserve_demo_plugin-0.1.dist-info"
META = {
    f"{DIST_INFO}/METADATA": "Metadata-Version: 2.1\nName: mirserve-demo-plugin\nVersion: 0.1\n",
    f"{DIST_INFO}/WHEEL": "Wheel-Version: 1.0\nGenerator: mirserve-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    f"{DIST_INFO}/entry_points.txt": (f"[mirserve.plugins]\ndemo = {PACKAGE}:register\n"
                                      f"demo_import = {PACKAGE}.on_import\nzz_broken = {PACKAGE}.broken\n"),
}


def build_wheel(directory: Path) -> Path:
    contents = {name: textwrap.dedent(text).encode() for name, text in {**FILES, **META}.items()}
    record = []
    for name, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{DIST_INFO}/RECORD,,")
    contents[f"{DIST_INFO}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / "mirserve_demo_plugin-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The directory pip installed the demo package into."""
    work = tmp_path_factory.mktemp("entry_points")
    target = work / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(target), "--no-index",
                           "--no-deps", "--no-compile", "--disable-pip-version-check", "--quiet",
                           str(build_wheel(work))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (target / DIST_INFO / "entry_points.txt").exists() and (target / DIST_INFO / "INSTALLER").exists()
    return target


@pytest.fixture
def on_path(installed, monkeypatch):
    monkeypatch.syspath_prepend(str(installed))
    yield installed
    PLUGINS.unload_all()  # also forgets the package's modules, before sys.path loses it


def test_entry_points_of_an_installed_package_are_loaded_with_the_package_as_origin(on_path):
    PLUGINS.ensure_loaded()
    records = {r.origin: r for r in PLUGINS.records}
    assert set(records) == {"package mirserve-demo-plugin 0.1, entry point demo",
                            "package mirserve-demo-plugin 0.1, entry point demo_import",
                            "package mirserve-demo-plugin 0.1, entry point zz_broken"}
    demo = records["package mirserve-demo-plugin 0.1, entry point demo"]
    assert (demo.status, demo.found_by, demo.provides) == (
        "loaded", "entry point", {"filters": ["demo_relu_watch"], "pipelines": ["demo_pipeline"]})
    assert FILTERS.get("demo_relu_watch").info.origin == demo.origin
    assert records["package mirserve-demo-plugin 0.1, entry point demo_import"].provides == {"targets": ["demo_npu"]}
    broken = records["package mirserve-demo-plugin 0.1, entry point zz_broken"]
    assert broken.status == "failed"
    assert broken.error == (f"RuntimeError: the demo package's broken entry point "
                            f"(at {on_path / PACKAGE / 'broken.py'}:2)")
    validate_options(OptimizeOptions(places="demo_npu/fp16/nchw", pipeline="demo_pipeline"))


def test_the_package_disappears_with_its_entry_points(on_path, monkeypatch):
    PLUGINS.ensure_loaded()
    assert "demo_relu_watch" in FILTERS
    PLUGINS.unload_all()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(on_path)])
    assert list_all()["plugins"] == [] and "demo_relu_watch" not in FILTERS and PACKAGE not in sys.modules


def test_the_cli_lists_an_installed_plugin_in_a_fresh_process(installed, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    env.pop("MIRSERVE_PLUGIN_PATH", None)
    done = subprocess.run([sys.executable, "-m", "worker.engine.cli", "passes", "--json"], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert [(p["origin"], p["status"]) for p in listing["plugins"]] == [
        ("package mirserve-demo-plugin 0.1, entry point demo", "loaded"),
        ("package mirserve-demo-plugin 0.1, entry point demo_import", "loaded"),
        ("package mirserve-demo-plugin 0.1, entry point zz_broken", "failed")]
    assert {"name": "demo_pipeline", "origin": "package mirserve-demo-plugin 0.1, entry point demo"}.items() <= \
        next(p for p in listing["pipelines"] if p["name"] == "demo_pipeline").items()
