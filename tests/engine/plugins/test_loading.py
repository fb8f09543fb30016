"""Loading plugins: discovery from the path, origins, broken plugins, half registrations, name clashes."""
from __future__ import annotations

import json
import os

import pytest

from tests.conftest import LIGHT
from tests.engine.plugins.conftest import load_path, write_plugin
from worker.engine import places
from worker.engine.api import list_all, list_passes, validate_options
from worker.engine.cli import main
from worker.engine.errors import OptionsError
from worker.engine.kernels import default_table
from worker.engine.options import OptimizeOptions
from worker.engine.passes.pipelines import get_pipeline
from worker.engine.passes.registry import REGISTRY
from worker.engine.plugins.discovery import FILES_VARIABLE
from worker.engine.plugins.filters import FILTERS
from worker.engine.plugins.loader import PLUGINS

GOOD = """
    from worker.engine.plugins import PassResult, register_filter, register_pass, register_pipeline

    @register_pass(name="{name}_pass", kind="debug", description="counts nodes")
    def count(ctx):
        return PassResult(data={{"nodes": len(ctx.graph)}})

    @register_filter("Relu", priority=120, description="looks at Relu nodes")
    def {name}_filter(ctx, node):
        return False

    register_pipeline(name="{name}_pipeline", description="type inference and the counter",
                      steps=["type_inference", "{name}_pass"])
"""

HALF = """
    from worker.engine.plugins import DomainOp, register_filter, register_kernels, register_op, register_pass
    from worker.engine.plugins import register_pipeline, register_target

    register_target("halfway", description="registered before the failure")
    register_op(DomainOp("HalfOp", ("x",), ("y",), {}, lambda opset: [], "registered before the failure"))
    register_kernels([{"op": "HalfOp", "domain": "mirserve", "since": 1, "until": None, "precision": "fp32",
                       "layout": "nchw", "inputs": [{"name": "x"}], "outputs": [{"name": "y"}],
                       "origin": "registered before the failure"}], target="halfway")

    @register_pass(name="half_pass", kind="debug", description="registered before the failure")
    def half_pass(ctx):
        return None

    register_pipeline(name="half_pipeline", description="d", steps=["type_inference", "half_pass"])

    @register_filter("Relu", priority=999, description="a priority outside every band")
    def half_filter(ctx, node):
        return False
"""


def record(origin_suffix: str) -> dict:
    found = [r.to_dict() for r in PLUGINS.records if r.origin.endswith(origin_suffix)]
    assert len(found) == 1, [r.origin for r in PLUGINS.records]
    return found[0]


def test_a_directory_on_the_path_loads_its_py_files_in_name_order_with_their_origins(tmp_path, monkeypatch):
    b = write_plugin(tmp_path / "dir", "b_plugin.py", GOOD.format(name="bee"))
    a = write_plugin(tmp_path / "dir", "a_plugin.py", GOOD.format(name="ay"))
    write_plugin(tmp_path / "dir", "_helper.py", "raise RuntimeError('never loaded')")
    single = write_plugin(tmp_path / "elsewhere", "single.py", GOOD.format(name="single"))
    records = load_path(monkeypatch, tmp_path / "dir", single)
    assert [(r["origin"], r["status"], r["found_by"]) for r in records] == [
        (str(a), "loaded", "MIRSERVE_PLUGIN_PATH"), (str(b), "loaded", "MIRSERVE_PLUGIN_PATH"),
        (str(single), "loaded", "MIRSERVE_PLUGIN_PATH")]
    assert records[0]["provides"] == {"passes": ["ay_pass"], "filters": ["ay_filter"], "pipelines": ["ay_pipeline"]}
    assert REGISTRY.get("bee_pass").info.origin == str(b)
    assert FILTERS.get("single_filter").info.origin == str(single)
    assert get_pipeline("ay_pipeline").origin == str(a)
    positions = {p["name"]: (p["origin"], p["position"]) for p in list_passes()}
    assert positions["ay_pass"] == (str(a), None)


def test_a_plugin_pipeline_runs_and_its_pass_is_traced_with_its_origin(tmp_path, monkeypatch):
    plugin = write_plugin(tmp_path, "p.py", GOOD.format(name="mine"))
    monkeypatch.setenv("MIRSERVE_PLUGIN_PATH", str(plugin))
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    assert main(["optimize", str(LIGHT / "light_squeezenet.onnx"), "-o", str(out), "--pipeline", "mine_pipeline",
                 "--no-verify", "--quiet", "--report", str(report)]) == 0
    trace = json.loads(report.read_text())["trace"]
    assert [(e["pass"], e["origin"]) for e in trace] == [("type_inference", "built-in"), ("mine_pass", str(plugin))]
    assert trace[1]["nodes"] == 105


def test_an_import_error_is_reported_and_the_cli_goes_on(tmp_path, monkeypatch, capsys):
    broken = write_plugin(tmp_path, "broken.py", "import json\nimport no_such_module_for_mirserve\n")
    good = write_plugin(tmp_path, "good.py", GOOD.format(name="good"))
    records = load_path(monkeypatch, broken, good)
    assert records[0] | {"provides": None} == {
        "origin": str(broken), "found_by": "MIRSERVE_PLUGIN_PATH", "status": "failed", "provides": None,
        "error": f"ModuleNotFoundError: No module named 'no_such_module_for_mirserve' (at {broken}:2)"}
    assert records[1]["status"] == "loaded"
    assert main(["passes"]) == 0
    table = capsys.readouterr().out
    assert f"failed  MIRSERVE_PLUGIN_PATH  {broken}  ModuleNotFoundError: No module named" in table
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(LIGHT / "light_squeezenet.onnx"), "-o", str(out), "--no-verify", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err == (f"mirserve: warning: plugin {broken} failed to load, so its passes, filters and pipelines are "
                   f"unavailable: ModuleNotFoundError: No module named 'no_such_module_for_mirserve' "
                   f"(at {broken}:2)\n")
    assert out.exists()


@pytest.mark.parametrize("source, error", [
    ("def broken(:\n", "SyntaxError: invalid syntax ({path}, line 1)"),
    ("import sys\nsys.exit(3)\n", "SystemExit: 3 (at {path}:2)"),
    ("x = 1 / 0\n", "ZeroDivisionError: division by zero (at {path}:1)"),
])
def test_other_failures_at_import_are_contained(tmp_path, monkeypatch, source, error):
    path = write_plugin(tmp_path, "bad.py", source)
    (entry,) = load_path(monkeypatch, path)
    assert entry["status"] == "failed" and entry["error"] == error.format(path=path)


def test_missing_and_non_python_entries_are_failures_not_crashes(tmp_path, monkeypatch):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    records = load_path(monkeypatch, tmp_path / "gone.py", text)
    assert [r["error"] for r in records] == [
        f"{tmp_path / 'gone.py'}: no such file or directory",
        f"{text}: not a Python file (a plugin is a .py file, or a directory of them)"]


def test_a_half_registered_plugin_leaves_nothing_registered(tmp_path, monkeypatch):
    path = write_plugin(tmp_path, "half.py", HALF)
    (entry,) = load_path(monkeypatch, path)
    assert entry["status"] == "failed"
    assert entry["error"].startswith("ValueError: priority 999 is outside the filter bands (PRE 0-199")
    line = 1 + path.read_text().splitlines().index('@register_filter("Relu", priority=999, description="a priority '
                                                   'outside every band")')
    assert entry["error"].endswith(f"(at {path}:{line})")
    assert entry["provides"] == {"passes": ["half_pass"], "pipelines": ["half_pipeline"], "targets": ["halfway"],
                                 "ops": ["HalfOp"], "kernels": ["halfway:mirserve.HalfOp:1-:fp32:nchw"]}
    assert default_table().get("halfway:mirserve.HalfOp:1-:fp32:nchw") is None
    assert "half_pass" not in REGISTRY and get_pipeline("half_pipeline") is None
    assert "halfway" not in {t.name for t in places.all_targets()} and "half_filter" not in FILTERS
    from worker.engine.mirserve_domain.ops import get_op
    assert get_op("HalfOp") is None


def test_a_run_asking_for_a_failed_plugins_names_fails_with_its_error(tmp_path, monkeypatch, capsys):
    path = write_plugin(tmp_path, "half.py", HALF)
    load_path(monkeypatch, path)
    with pytest.raises(OptionsError) as error:
        validate_options(OptimizeOptions(pipeline="half_pipeline"))
    assert error.value.field == "pipeline"
    assert str(error.value).startswith(f"unknown pipeline 'half_pipeline'; it comes from plugin {path}, which failed "
                                       f"to load: ValueError: priority 999 is outside the filter bands")
    with pytest.raises(OptionsError, match=f"unknown pass 'half_pass' in disabled_passes; it comes from plugin {path}"):
        validate_options(OptimizeOptions(disabled_passes=("half_pass",)))
    code = main(["optimize", str(LIGHT / "light_squeezenet.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--pipeline", "half_pipeline"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and err[-1].startswith("mirserve: error: unknown pipeline 'half_pipeline'; it comes from plugin")


def test_an_unknown_name_while_a_plugin_is_broken_points_at_that_plugin(tmp_path, monkeypatch):
    path = write_plugin(tmp_path, "broken.py", "import no_such_module_for_mirserve\n")
    load_path(monkeypatch, path)
    with pytest.raises(OptionsError, match=rf"unknown pipeline 'edge'; a plugin that failed to load may provide it "
                                           rf"\({path}: ModuleNotFoundError"):
        validate_options(OptimizeOptions(pipeline="edge"))


@pytest.mark.parametrize("source, message", [
    ("""
     from worker.engine.plugins import register_pass
     @register_pass(name="type_inference", kind="debug", description="d")
     def f(ctx): pass
     """, "ValueError: pass 'type_inference' from {path} clashes with the pass of the same name from built-in"),
    ("""
     from worker.engine.plugins import register_filter
     @register_filter("Relu", name="memory_plan", description="d")
     def f(ctx, node): pass
     """, "ValueError: filter 'memory_plan' from {path} clashes with the pass of the same name from built-in"),
    ("""
     from worker.engine.plugins import register_pipeline
     register_pipeline(name="default", description="d", steps=["type_inference"])
     """, "ValueError: pipeline 'default' from {path} clashes with the pipeline of the same name from built-in"),
    ("""
     from worker.engine.plugins import register_target
     register_target("arm")
     """, "ValueError: target 'arm' is already registered by built-in"),
])
def test_a_clash_with_a_built_in_is_refused_naming_both_origins(tmp_path, monkeypatch, source, message):
    path = write_plugin(tmp_path, "clash.py", source)
    (entry,) = load_path(monkeypatch, path)
    assert entry["status"] == "failed" and entry["error"].startswith(message.format(path=path))
    assert entry["origin"] == str(path)  # the plugin's side of the clash
    assert REGISTRY.get("type_inference").info.origin == "built-in"
    assert get_pipeline("default").origin == "built-in" and places.get_target("arm").origin == "built-in"


def test_a_clash_between_two_plugins_keeps_the_first_and_names_both(tmp_path, monkeypatch):
    first = write_plugin(tmp_path, "a_first.py", GOOD.format(name="same"))
    second = write_plugin(tmp_path, "b_second.py", GOOD.format(name="same"))
    records = load_path(monkeypatch, tmp_path)
    assert [r["status"] for r in records] == ["loaded", "failed"]
    assert records[1]["error"].startswith(f"ValueError: pass 'same_pass' from {second} clashes with the pass of the "
                                          f"same name from {first}")
    assert REGISTRY.get("same_pass").info.origin == str(first)
    assert FILTERS.get("same_filter").info.origin == str(first)


def test_a_pass_named_like_another_plugins_filter_is_refused(tmp_path, monkeypatch):
    first = write_plugin(tmp_path, "a.py", GOOD.format(name="one"))
    second = write_plugin(tmp_path, "b.py", """
        from worker.engine.plugins import register_pass
        @register_pass(name="one_filter", kind="debug", description="d")
        def f(ctx): pass
        """)
    records = load_path(monkeypatch, first, second)
    assert records[1]["error"] == (f"ValueError: pass 'one_filter' from {second} clashes with the filter of the same "
                                   f"name from {first}")
    assert "one_filter" not in REGISTRY and FILTERS.get("one_filter").info.origin == str(first)


def test_registrations_through_the_engines_own_apis_name_the_plugin(tmp_path, monkeypatch):
    path = write_plugin(tmp_path, "direct.py", """
        from worker.engine.passes.pipelines import Pipeline, register_pipeline
        register_pipeline(Pipeline(name="direct_pipeline", description="d", steps=("type_inference",)))
        """)
    (entry,) = load_path(monkeypatch, path)
    assert entry["status"] == "loaded" and entry["provides"] == {"pipelines": ["direct_pipeline"]}
    assert get_pipeline("direct_pipeline").origin == entry["origin"]


def test_a_registration_that_claims_to_be_built_in_is_refused_and_removed(tmp_path, monkeypatch):
    path = write_plugin(tmp_path, "liar.py", """
        from worker.engine.places import register_target
        register_target("sneaky", origin="built-in")
        """)
    (entry,) = load_path(monkeypatch, path)
    assert entry["error"] == ("it registered target 'sneaky' with origin 'built-in'; register it through "
                              "worker.engine.plugins.register_target so that it names this plugin")
    assert "sneaky" not in {t.name for t in places.all_targets()}


def test_kernels_added_under_another_origin_are_refused_and_removed_without_touching_that_origin(tmp_path,
                                                                                               monkeypatch):
    before = {k.id for k in default_table()}
    path = write_plugin(tmp_path, "kernels.py", """
        from worker.engine.kernels import default_table
        default_table().add([{"op": "Relu", "domain": "", "since": 1, "until": None, "precision": "fp32",
                              "layout": "nhwc", "variant": "sneaky", "inputs": [{"name": "X"}],
                              "outputs": [{"name": "Y"}], "origin": "a claim"}], origin="x86.json", target="x86")
        """)
    (entry,) = load_path(monkeypatch, path)
    assert entry["error"] == ("it registered kernel 'x86:Relu:1-:fp32:nhwc:sneaky' with origin 'x86.json'; register "
                              "it through worker.engine.plugins.register_kernels so that it names this plugin")
    assert {k.id for k in default_table()} == before


def test_plugin_given_with_the_cli_option_is_loaded_and_exported_to_child_processes(tmp_path, capsys):
    path = write_plugin(tmp_path, "cli_plugin.py", GOOD.format(name="cli"))
    other = write_plugin(tmp_path, "other.py", GOOD.format(name="other"))
    assert main(["--plugin", str(other), "passes", "--json", "--plugin", str(path)]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [(p["origin"], p["found_by"], p["status"]) for p in listing["plugins"]] == [
        (str(other), "--plugin", "loaded"), (str(path), "--plugin", "loaded")]
    filters = {f["name"]: f for f in listing["filters"]}
    assert filters["cli_filter"] | {"description": ""} == {
        "name": "cli_filter", "kind": "filter", "description": "", "level": 1, "targets": None,
        "excluded_targets": [], "kernels": [], "portable": True, "origin": str(path), "op_type": "Relu",
        "domain": "", "binds": "Relu", "priority": 120, "band": "PRE", "stage": "filter_pre"}
    assert {"name": "cli_pipeline", "origin": str(path), "description": "type inference and the counter",
            "passes": ["type_inference", "cli_pass"]} in listing["pipelines"]
    assert os.environ[FILES_VARIABLE] == f"{other}:{path}"


def test_a_pipeline_builder_that_raises_or_names_an_unknown_pass_fails_the_run_naming_it(tmp_path, monkeypatch):
    path = write_plugin(tmp_path, "builders.py", """
        from worker.engine.plugins import pipeline_builder

        @pipeline_builder(name="fragile", description="reads an option that does not exist")
        def fragile(options):
            return ["type_inference"] + (["x"] if options.colour else [])

        @pipeline_builder(name="dangling", description="names a pass nobody registered")
        def dangling(options):
            return ["type_inference", "ghost_pass"]
        """)
    load_path(monkeypatch, path)
    with pytest.raises(OptionsError, match=rf"^pipeline 'fragile' from {path} failed to choose its passes: "
                                           rf"AttributeError: .*'colour' \(at {path}:6\)$"):
        validate_options(OptimizeOptions(pipeline="fragile"))
    with pytest.raises(OptionsError, match=rf"^pipeline 'dangling' from {path} names pass 'ghost_pass', which is not "
                                           rf"registered$"):
        validate_options(OptimizeOptions(pipeline="dangling"))


def test_a_filter_can_be_disabled_by_name_per_run(tmp_path, monkeypatch):
    path = write_plugin(tmp_path, "p.py", GOOD.format(name="dis"))
    load_path(monkeypatch, path)
    validate_options(OptimizeOptions(disabled_passes=("dis_filter", "filter_post")))
    assert "dis_filter" in [f["name"] for f in list_all()["filters"]]


def test_filters_that_undo_each_other_fail_the_cli_run_with_their_names(tmp_path, monkeypatch, capsys):
    path = write_plugin(tmp_path, "seesaw.py", """
        from worker.engine.plugins import PRIORITY_PRE, register_filter

        def swap(new_op):
            def run(ctx, node):
                node.graph.add_node(new_op, [node.input(0)], [node.output()], before=node)
                node.graph.remove_node(node)
                return True
            return run

        register_filter("Relu", priority=PRIORITY_PRE, name="relu_to_abs", description="d")(swap("Abs"))
        register_filter("Abs", priority=PRIORITY_PRE + 1, name="abs_to_relu", description="d")(swap("Relu"))
        """)
    monkeypatch.setenv("MIRSERVE_PLUGIN_PATH", str(path))
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(LIGHT / "light_squeezenet.onnx"), "-o", str(out), "--no-verify"]) == 1
    assert capsys.readouterr().err == (
        f"mirserve: error: filters 'relu_to_abs' (priority 100, Relu, from {path}) and 'abs_to_relu' (priority 101, "
        f"Abs, from {path}) kept changing the graph: stage filter_pre restarted from its first level 50 times "
        f"without settling, so they most likely undo each other's changes\n")
    assert not out.exists()
