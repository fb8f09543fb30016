"""File = pass: each module of a pass family registers exactly the pass it is named after, helpers live in
passes/support/, no family imports another family's modules, and every built-in pass says which peer's pass
it reproduces (or none)."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import worker.engine.passes as passes_package
from worker.engine.api import list_passes
from worker.engine.passes import REGISTRY
from worker.engine.passes.base import PEERS
from worker.engine.origin import BUILT_IN
from worker.engine.passes.pipelines import CLEANUP

PASSES = Path(passes_package.__file__).parent
PACKAGE = "worker.engine.passes"
FAMILIES = sorted(d.name for d in PASSES.iterdir() if (d / "__init__.py").exists() and d.name != "support")


def modules(folder: str) -> list[str]:
    return sorted(p.stem for p in (PASSES / folder).glob("*.py") if p.stem != "__init__")


def built_in() -> list:
    return [p for p in REGISTRY if p.info.origin == BUILT_IN and p.run.__module__.startswith(PACKAGE + ".")]


def test_each_file_of_a_family_registers_the_pass_it_is_named_after():
    registered = defaultdict(list)
    for p in built_in():
        registered[p.run.__module__].append(p.name)
    wrong = {f"{family}/{stem}.py": registered.get(f"{PACKAGE}.{family}.{stem}", [])
             for family in FAMILIES for stem in modules(family)
             if registered.get(f"{PACKAGE}.{family}.{stem}") != [stem]}
    assert wrong == {}, "files that do not register exactly the pass they are named after (and what they register)"


def test_every_built_in_pass_lives_in_a_family_file_of_its_name():
    def placed(p) -> bool:
        parts = p.run.__module__.split(".")  # worker.engine.passes.<family>.<file>
        return len(parts) == 5 and parts[3] in FAMILIES and parts[4] == p.name

    assert {p.name: p.run.__module__ for p in built_in() if not placed(p)} == {}
    assert not any(p.run.__module__.startswith(f"{PACKAGE}.support") for p in REGISTRY)
    assert len(built_in()) >= 60


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_family_imports_another_familys_modules_and_support_imports_no_family():
    crossings = []
    for folder in [*FAMILIES, "support"]:
        for path in sorted((PASSES / folder).glob("*.py")):
            for module in imported_modules(path):
                parts = module.split(".")
                if module.startswith(PACKAGE + ".") and len(parts) > 3 and parts[3] in FAMILIES \
                        and parts[3] != folder:
                    crossings.append(f"{folder}/{path.name} imports {module}")
    assert crossings == []


def test_every_built_in_pass_names_its_peer_from_the_known_ones():
    listed = {p["name"]: p for p in list_passes()}
    assert {p.name: p.info.peer for p in built_in() if p.info.peer not in (*PEERS, None)} == {}
    assert listed["conv_bn_fuse"]["peer"] == "Paddle-Lite" and listed["eliminate_deadend"]["peer"] == "onnxoptimizer"
    assert listed["fold_scale_axis"]["peer"] == "NNVM" and listed["eliminate_pooling1x1"]["peer"] == "ncnn"
    assert listed["type_cast_cleanup"]["peer"] is None  # mirserve's own


def test_cleanup_passes_are_listed_in_pipeline_order():
    listed = {p["name"]: p for p in list_passes()}
    positions = [listed[name]["position"] for name in CLEANUP]
    assert all(isinstance(p, int) for p in positions) and positions == sorted(positions)
    for name in CLEANUP:
        info = listed[name]
        assert (info["kind"], info["level"], info["portable"]) == ("program", 1, True), name
        assert info["description"] and "\n" not in info["description"]
    assert len(set(CLEANUP)) == len(CLEANUP) == 42
