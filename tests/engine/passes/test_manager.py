"""The registry and the manager: registration, every skip rule, fixed points, trace and progress."""
from __future__ import annotations

import numpy as np
import pytest

from worker.engine.errors import PassError
from worker.engine.ir import Graph, Model, Node, Value
from worker.engine.options import OptimizeOptions
from worker.engine.passes import FixedPoint, PassContext, PassKind, PassManager, PassResult
from worker.engine.passes.base import Analysis
from worker.engine.passes.manager import skip_reason
from worker.engine.passes.registry import PassRegistry, register_pass
from worker.engine.places import parse_places


class Kernels:
    def __init__(self, available: dict[tuple[str, str], set[str]]):
        self.available = available

    def has_kernel(self, op_type, domain, targets):
        return bool(self.available.get((op_type, domain), set()) & set(targets))


def tiny_model() -> Model:
    graph = Graph("g")
    x = graph.add_input(Value("x", 1, (4,)))
    relu = graph.append(Node("Relu", [x], [Value("y", 1, (4,))]))
    graph.set_outputs([relu.output()])
    return Model(graph, ir_version=8, opset_imports={"": 17})


def context(places="arm/fp32/nchw", kernels=None, **options) -> PassContext:
    opts = OptimizeOptions(places=places, **options)
    return PassContext(tiny_model(), opts, parse_places(opts.places), kernels=kernels)


@pytest.fixture
def registry():
    reg = PassRegistry()
    calls = []

    def recorder(name):
        def run(ctx):
            calls.append(name)
            return PassResult()
        return run

    specs = [
        dict(name="always", kind="debug", description="runs everywhere", level=0),
        dict(name="arm_only", kind="program", description="bound to arm", targets=["arm"]),
        dict(name="not_on_opencl", kind="program", description="excluded on opencl", excluded_targets=["opencl"]),
        dict(name="needs_fused", kind="program", description="binds a kernel", kernels=["mirserve.FusedConvRelu"]),
        dict(name="level2", kind="program", description="level 2", level=2),
        dict(name="own_domain", kind="program", description="emits domain ops", portable=False),
    ]
    for spec in specs:
        register_pass(registry=reg, **spec)(recorder(spec["name"]))
    reg.calls = calls
    return reg


def skips(registry, ctx):
    return {p.name: skip_reason(p.info, ctx) for p in registry}


def test_skip_rules_each_with_its_reason(registry):
    reasons = skips(registry, context("opencl/fp16/nchw", opt_level=1, portable=True))
    assert reasons["always"] is None
    assert reasons["arm_only"].startswith("bound to target(s) arm, none of which is a valid place")
    assert reasons["not_on_opencl"] == "excluded on target(s) opencl, which are valid places"
    assert "needs a mirserve.FusedConvRelu kernel" in reasons["needs_fused"]
    assert reasons["level2"] == "needs opt level 2, the run asked for 1"
    assert "portable" in reasons["own_domain"]


def test_passes_run_when_their_conditions_hold(registry):
    kernels = Kernels({("FusedConvRelu", "mirserve"): {"arm"}})
    assert all(r is None for r in skips(registry, context("arm/fp32/nchw", kernels=kernels)).values())


def test_kernel_registered_only_for_an_invalid_target_is_not_enough(registry):
    kernels = Kernels({("FusedConvRelu", "mirserve"): {"cuda"}})
    assert skips(registry, context("arm/fp32/nchw", kernels=kernels))["needs_fused"] is not None


def test_disabled_by_name_wins_over_everything(registry):
    reasons = skips(registry, context(opt_level=0, disabled_passes=("level2", "always")))
    assert reasons["always"] == "disabled by the user"
    assert reasons["level2"] == "disabled by the user"


def test_trace_progress_and_order(registry):
    ctx = context("arm/fp32/nchw", kernels=Kernels({}))
    progress = []
    manager = PassManager(registry, progress=lambda i, n, name: progress.append((i, n, name)))
    trace = manager.run(ctx, ["always", "arm_only", "needs_fused", "level2"])
    assert registry.calls == ["always", "arm_only", "level2"]
    assert progress == [(1, 4, "always"), (2, 4, "arm_only"), (4, 4, "level2")]
    assert [(e["pass"], e["skipped"] is None) for e in trace] == \
        [("always", True), ("arm_only", True), ("needs_fused", False), ("level2", True)]
    entry = trace[0]
    for key in ("pass", "kind", "origin", "seconds", "skipped", "nodes_before", "nodes_after",
                "values_before", "values_after", "rewrites", "details"):
        assert key in entry
    assert entry["kind"] == "debug" and entry["nodes_before"] == entry["nodes_after"] == 1


def test_fixed_point_stops_when_nothing_changes_or_at_the_cap():
    reg = PassRegistry()
    budget = {"left": 3}

    @register_pass(registry=reg, name="shrink", kind="program", description="rewrites while budget lasts")
    def shrink(ctx):
        if budget["left"]:
            budget["left"] -= 1
            return PassResult(rewrites=1)
        return PassResult()

    @register_pass(registry=reg, name="forever", kind="program", description="always claims a rewrite")
    def forever(ctx):
        return PassResult(rewrites=1)

    trace = PassManager(reg).run(context(), [FixedPoint("group", ("shrink",), max_iterations=10)])
    timing = {"start": 0, "seconds": 0}
    assert trace[-1] | timing == {"pass": "group", "kind": "fixed_point", "origin": "built-in", **timing,
                                  "skipped": None, "rewrites": 3, "iterations": 4, "converged": True,
                                  "max_iterations": 10}
    manager = PassManager(reg)
    trace = manager.run(context(), [FixedPoint("loop", ("shrink", "forever"), max_iterations=5)])
    assert trace[-1]["iterations"] == 5 and trace[-1]["converged"] is False
    assert [e.get("iteration") for e in trace[:-1] if e["pass"] == "forever"] == [1, 2, 3, 4, 5]
    # a group stopped at its cap is a warning in the report, naming the passes still rewriting at the end
    [warning] = manager.warnings()
    assert warning["kind"] == "not_converged" and warning["group"] == "loop" and warning["passes"] == ["forever"]
    assert "were still rewriting after 5 iterations of loop" in warning["message"]
    assert PassManager(reg).warnings() == []


def test_a_failing_pass_is_named_when_strict():
    reg = PassRegistry()

    @register_pass(registry=reg, name="broken", kind="program", description="raises")
    def broken(ctx):
        raise IndexError("list index out of range")

    with pytest.raises(PassError, match="pass 'broken' failed: IndexError: list index out of range"):
        PassManager(reg).run(context(strict=True), ["broken"])


def test_unknown_pass_in_a_pipeline_and_name_clashes():
    reg = PassRegistry()
    with pytest.raises(PassError, match="names pass 'nope'"):
        PassManager(reg).run(context(), ["nope"])
    register_pass(registry=reg, name="p", kind="debug", description="first")(lambda ctx: None)
    with reg.origin("plugin.py"):
        with pytest.raises(ValueError, match="'p' from plugin.py clashes with the pass of the same name from "
                                             "built-in"):
            register_pass(registry=reg, name="p", kind="debug", description="second")(lambda ctx: None)


def test_program_passes_get_topological_order_restored():
    reg = PassRegistry()

    @register_pass(registry=reg, name="append_producer", kind=PassKind.PROGRAM, description="edits")
    def append_producer(ctx):
        graph = ctx.graph
        relu = graph.nodes_of_type("Relu")[0]
        neg = graph.add_node("Neg", [graph.inputs[0]])  # appended after its consumer-to-be
        relu.set_input(0, neg.output())
        return PassResult(rewrites=1)

    ctx = context()
    PassManager(reg).run(ctx, ["append_producer"])
    assert [n.op_type for n in ctx.graph] == ["Neg", "Relu"]


def test_options_validation_names_the_field():
    from worker.engine.errors import OptionsError

    with pytest.raises(OptionsError) as error:
        OptimizeOptions.from_dict({"opt_level": 7})
    assert error.value.field == "opt_level"
    with pytest.raises(OptionsError) as error:
        OptimizeOptions.from_dict({"input_shapes": {"x": [1, -3]}})
    assert error.value.field == "input_shapes"
    with pytest.raises(OptionsError) as error:
        OptimizeOptions.from_dict({"colour": "blue"})
    assert error.value.field == "colour"
    options = OptimizeOptions.from_dict({"input_shapes": {"x": [1, 3]}, "disabled_passes": "a,b", "rtol": 0.01})
    assert options.input_shapes == {"x": (1, 3)} and options.disabled_passes == ("a", "b")
    assert OptimizeOptions.from_dict(options.to_dict()) == options


def analyses_registry(calls: list) -> PassRegistry:
    """type_inference (recorded), a pass that leaves types stale when asked to, and readers of types."""
    reg = PassRegistry()

    @register_pass(registry=reg, name="type_inference", kind="stmt", level=0, requires=["order"],
                   description="stands in for type inference")
    def infer(ctx):
        calls.append("type_inference")
        return PassResult()

    @register_pass(registry=reg, name="refine", kind="program", description="may leave types stale",
                   invalidates=["types", "order"])
    def refine(ctx):
        calls.append("refine")
        result = PassResult(rewrites=1)
        if not ctx.report.get("stale"):
            result.preserve(Analysis.TYPES)
        return result

    @register_pass(registry=reg, name="reader", kind="program", description="reads shapes")
    def reader(ctx):
        calls.append("reader")
        return PassResult()

    @register_pass(registry=reg, name="blind", kind="debug", description="needs no types", requires=())
    def blind(ctx):
        calls.append("blind")
        return PassResult()

    return reg


def test_stale_types_are_inferred_again_as_a_traced_step_before_the_pass_that_needs_them():
    calls = []
    ctx = context()
    ctx.report["stale"] = True
    trace = PassManager(analyses_registry(calls)).run(ctx, ["refine", "blind", "reader", "reader"])
    assert calls == ["refine", "blind", "type_inference", "reader", "reader"]
    step = next(e for e in trace if e["pass"] == "type_inference")
    assert step["required_by"] == "reader" and step["stale_after"] == "refine"


def test_a_pass_that_preserved_the_types_costs_no_inference():
    calls = []
    PassManager(analyses_registry(calls)).run(context(), ["refine", "reader"])
    assert calls == ["refine", "reader"]


def test_types_left_stale_by_the_last_pass_are_inferred_before_the_run_ends():
    calls = []
    ctx = context()
    ctx.report["stale"] = True
    trace = PassManager(analyses_registry(calls)).run(ctx, ["reader", "refine"])
    assert calls == ["reader", "refine", "type_inference"]
    assert trace[-1]["required_by"] == "the end of the run"


def test_analyses_are_declared_in_the_listing():
    from worker.engine.passes import REGISTRY

    info = REGISTRY.get("eliminate_shape_op").info.to_dict()
    assert info["invalidates"] == ["order", "types"] and info["requires"] == ["order", "types"]
    assert REGISTRY.get("type_inference").info.to_dict()["requires"] == ["order"]
    assert REGISTRY.get("static_kernel_pick").info.to_dict()["invalidates"] == []  # a stmt pass


def test_no_pass_module_runs_another_pass():
    """Passes never call passes: no pass module imports a registered pass function of another module."""
    import ast
    from pathlib import Path

    import worker.engine.passes as passes_package
    from worker.engine.passes import REGISTRY

    functions = {(p.run.__module__, p.run.__name__) for p in REGISTRY}
    root = Path(passes_package.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        module = "worker.engine." + ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if (node.module, alias.name) in functions and node.module != module:
                        offenders.append(f"{module} imports {alias.name} from {node.module}")
    assert offenders == []


def failing_registry(calls: list) -> PassRegistry:
    """A pass that edits the graph and then raises, and one that runs after it."""
    reg = PassRegistry()

    @register_pass(registry=reg, name="breaks", kind="program", description="edits, then raises")
    def breaks(ctx):
        calls.append("breaks")
        graph = ctx.graph
        node = graph.nodes_of_type("Relu")[0]
        graph.add_node("Neg", [graph.inputs[0]], 1)
        node.op_type = "Sigmoid"
        ctx.report["half_written"] = True
        return {}["missing"]

    @register_pass(registry=reg, name="after", kind="debug", description="runs after")
    def after(ctx):
        calls.append(("after", [n.op_type for n in ctx.graph]))
        return PassResult(rewrites=1)

    return reg


def test_a_pass_that_raises_is_undone_and_the_run_goes_on_without_it():
    calls = []
    ctx = context(strict=False)
    manager = PassManager(failing_registry(calls))
    trace = manager.run(ctx, [FixedPoint("loop", ("breaks", "after"), max_iterations=3)])
    assert calls == ["breaks", ("after", ["Relu"]), ("after", ["Relu"]), ("after", ["Relu"])]
    failed = trace[0]
    assert failed["pass"] == "breaks" and failed["rewrites"] == 0 and failed["nodes_after"] == 1
    assert failed["failed"]["error"] == "KeyError: 'missing'"
    assert failed["failed"]["node"] == "relu" and failed["failed"]["op"] == "Sigmoid"  # as it was at the failure
    assert failed["failed"]["where"].endswith(f"test_manager.py:{breaks_line()}")
    assert "half_written" not in ctx.report
    assert [e for e in trace if e["pass"] == "breaks"] == [failed]  # not run again (skips after iteration 1
    manager.run(ctx, ["breaks"])                                      # are not traced; outside they are)
    assert manager.trace[-1]["skipped"].startswith("failed earlier in this run")
    assert [f.pass_name for f in manager.failures] == ["breaks"]
    assert manager.failures[0].message.startswith("pass 'breaks' failed: KeyError: 'missing' (at node relu")


def breaks_line() -> int:
    import inspect

    source, start = inspect.getsourcelines(failing_registry)
    return start + next(i for i, line in enumerate(source) if "{}[\"missing\"]" in line)


def test_strict_makes_a_failing_pass_fail_the_run():
    with pytest.raises(PassError, match=r"^pass 'breaks' failed: KeyError: 'missing' \(at node relu \(Sigmoid\), "):
        PassManager(failing_registry([])).run(context(strict=True), ["breaks"])


def test_user_errors_are_never_undone_into_warnings():
    from worker.engine.errors import UnsupportedOpsError

    reg = PassRegistry()

    @register_pass(registry=reg, name="refuses", kind="debug", description="a user error")
    def refuses(ctx):
        raise UnsupportedOpsError("no kernel for Frobnicate")

    with pytest.raises(UnsupportedOpsError):
        PassManager(reg).run(context(strict=False), ["refuses"])
