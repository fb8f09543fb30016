"""The filter engine: priority order, LAYER_FIRST/LAYER_LAST, restart after a change, the restart cap, callbacks."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from worker.engine.errors import InternalError, PassError
from worker.engine.ir import load_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.passes.registry import REGISTRY
from worker.engine.places import parse_places
from worker.engine.plugins import LAYER_FIRST, LAYER_LAST, register_filter, register_post_callback, register_pre_callback
from worker.engine.plugins.engine import FilterLoopError, run_stage
from worker.engine.plugins.filters import BANDS, FilterRegistry, band_of

PRE = BANDS[0]


def context(tmp_path, nodes, initializers=(), **options) -> PassContext:
    """A typed context over y = nodes(x), x and y float [2, 3]."""
    proto = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])], initializers)
    onnx.save(proto, str(tmp_path / "m.onnx"))
    opts = OptimizeOptions(**options)
    ctx = PassContext(load_model(tmp_path / "m.onnx"), opts, parse_places(opts.places))
    PassManager().run(ctx, ["type_inference"])
    return ctx


def chain(*ops: str) -> list:
    """x -> ops[0] -> ... -> ops[-1] -> y, unary ops."""
    names = ["x"] + [f"t{i}" for i in range(len(ops) - 1)] + ["y"]
    return [helper.make_node(op, [names[i]], [names[i + 1]], name=f"{op.lower()}{i}") for i, op in enumerate(ops)]


def ops(ctx) -> list[str]:
    return [node.op_type for node in ctx.graph]


@pytest.fixture
def registry():
    with REGISTRY.origin("test_plugin.py"):
        yield FilterRegistry()


def recorder(log, label, result=False):
    def run(ctx, node):
        log.append((label, node.name))
        return result
    return run


def test_levels_run_lowest_priority_first_whatever_the_registration_order(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu", "Neg"))
    log = []
    for priority in (30, 10, 20):
        register_filter(LAYER_FIRST, priority=priority, name=f"p{priority}", description="records",
                        registry=registry)(recorder(log, priority))
    result = run_stage(ctx, PRE, registry=registry)
    assert log == [(10, "relu0"), (10, "neg1"), (20, "relu0"), (20, "neg1"), (30, "relu0"), (30, "neg1")]
    assert result.rewrites == 0 and result.data["restarts"] == 0


def test_within_a_level_first_then_op_type_then_last_on_each_node(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu", "Neg", "Relu"))
    log = []
    register_filter(LAYER_LAST, priority=5, name="last", description="d", registry=registry)(recorder(log, "last"))
    register_filter("Relu", priority=5, name="relu", description="d", registry=registry)(recorder(log, "relu"))
    register_filter(LAYER_FIRST, priority=5, name="first", description="d", registry=registry)(recorder(log, "first"))
    register_filter("Neg", priority=6, name="neg", description="d", registry=registry)(recorder(log, "neg"))
    run_stage(ctx, PRE, registry=registry)
    assert log == [("first", "relu0"), ("relu", "relu0"), ("last", "relu0"),
                   ("first", "neg1"), ("last", "neg1"),
                   ("first", "relu2"), ("relu", "relu2"), ("last", "relu2"),
                   ("neg", "neg1")]


def test_a_level_that_changed_the_graph_restarts_from_the_first_level(tmp_path, registry):
    # y = Relu(Neg(Sub(0, x))): level 20 turns Sub(0, x) into Neg(x); only a restart lets level 10 then
    # remove the Neg pair, which it could not see on its first visit.
    nodes = [helper.make_node("Sub", ["zero", "x"], ["s"]), helper.make_node("Neg", ["s"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    ctx = context(tmp_path, nodes, [tensor("zero", np.zeros((), np.float32))])
    visits = []

    @register_filter("Neg", priority=10, description="Neg(Neg(a)) -> a", registry=registry)
    def neg_neg_eliminate(ctx, node):
        visits.append(10)
        inner = node.input(0).producer
        if inner is None or inner.op_type != "Neg" or not node.input(0).has_single_consumer():
            return False
        node.graph.replace_all_uses(node.output(), inner.input(0))
        node.graph.remove_nodes([node, inner])
        return True

    @register_filter("Sub", priority=20, description="Sub(0, a) -> Neg(a)", registry=registry)
    def zero_sub_to_neg(ctx, node):
        visits.append(20)
        zero = node.input(0).constant_value()
        if zero is None or np.any(zero != 0):
            return False
        node.graph.add_node("Neg", [node.input(1)], [node.output()], before=node)
        node.graph.remove_node(node)
        return {"from": ["Sub"], "to": ["Neg"]}

    result = run_stage(ctx, PRE, registry=registry)
    assert ops(ctx) == ["Relu"] and ctx.graph.nodes_of_type("Relu")[0].input(0).name == "x"
    assert visits == [10, 20, 10, 10]  # 20 changed -> restart; 10 changed -> restart; 10 and 20 settle
    assert result.data["restarts"] == 2 and result.rewrites == 2
    first, second = result.details
    assert first | {"node": ""} == {"rule": "zero_sub_to_neg", "origin": "test_plugin.py", "priority": 20,
                                    "node": "", "op_type": "Sub", "from": ["Sub"], "to": ["Neg"]}
    assert second["rule"] == "neg_neg_eliminate"


def test_two_filters_that_undo_each_other_are_stopped_and_named(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu", "Neg"))

    def swap(old, new):
        def run(ctx, node):
            node.graph.add_node(new, [node.input(0)], [node.output()], before=node)
            node.graph.remove_node(node)
            return True
        return run

    register_filter("Relu", priority=10, name="relu_to_abs", description="d", registry=registry)(swap("Relu", "Abs"))
    register_filter("Abs", priority=20, name="abs_to_relu", description="d", registry=registry)(swap("Abs", "Relu"))
    with pytest.raises(FilterLoopError) as error:
        run_stage(ctx, PRE, registry=registry, max_restarts=6)
    message = str(error.value)
    assert message.startswith("filters 'relu_to_abs' (priority 10, Relu, from test_plugin.py) and 'abs_to_relu' "
                              "(priority 20, Abs, from test_plugin.py) kept changing the graph: stage filter_pre "
                              "restarted from its first level 6 times without settling")
    assert "undo each other" in message


def test_a_filter_that_always_claims_a_change_is_named_alone(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu", "Neg"))
    register_filter("Neg", priority=10, name="liar", description="d", registry=registry)(lambda ctx, node: True)
    register_filter("Relu", priority=10, name="honest", description="d", registry=registry)(lambda c, n: False)
    with pytest.raises(FilterLoopError, match=r"^filter 'liar' \(priority 10, Neg, from test_plugin.py\) kept "
                                              r"changing the graph: .* reports a change it does not make"):
        run_stage(ctx, PRE, registry=registry, max_restarts=3)


def test_a_node_removed_by_one_filter_is_not_given_to_the_next(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu", "Neg", "Relu"))
    seen = []

    @register_filter("Neg", priority=1, description="drops every Neg", registry=registry)
    def drop(ctx, node):
        node.graph.replace_all_uses(node.output(), node.input(0))
        node.graph.remove_node(node)
        return True

    register_filter(LAYER_LAST, priority=1, name="after", description="d", registry=registry)(recorder(seen, "x"))
    run_stage(ctx, PRE, registry=registry)
    assert ("x", "neg1") not in seen and ops(ctx) == ["Relu", "Relu"]


def test_filters_reach_into_if_bodies(tmp_path, registry):
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["b"], name="inner_neg")], "then", [],
                               [vinfo("b", shape=[2, 3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)]
    ctx = context(tmp_path, nodes, [tensor("zero", np.zeros((), np.float32))])
    seen = []
    register_filter("Neg", priority=1, name="neg", description="d", registry=registry)(recorder(seen, "neg"))
    run_stage(ctx, PRE, registry=registry)
    assert len(seen) == 2 and all(name.startswith("inner_neg") for _, name in seen)


def test_callbacks_run_before_and_after_the_filters_and_a_change_counts(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu"))
    log = []

    @register_pre_callback(description="counts nodes", registry=registry)
    def census(ctx):
        log.append(("pre", len(ctx.graph)))

    @register_post_callback(description="stamps the model", registry=registry)
    def stamp(ctx):
        log.append(("post", len(ctx.graph)))
        ctx.model.metadata["stamped"] = "yes"
        return True

    register_filter("Relu", priority=1, name="relu", description="d", registry=registry)(recorder(log, "filter"))
    result = run_stage(ctx, PRE, before=registry.callbacks("pre"), after=registry.callbacks("post"),
                       registry=registry)
    assert log == [("pre", 1), ("filter", "relu0"), ("post", 1)]
    assert result.rewrites == 1 and result.details == [{"rule": "stamp", "origin": "test_plugin.py",
                                                        "callback": "post"}]
    assert ctx.model.metadata["stamped"] == "yes"
    assert [f["name"] for f in result.data["filters"]] == ["census", "relu", "stamp"]
    assert result.data["plugins"] == ["test_plugin.py"]


def test_filters_obey_the_pass_skip_rules(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu"), opt_level=1, disabled_passes=("off",), places="arm/fp32/nchw")
    log = []
    register_filter("Relu", priority=1, name="l2", level=2, description="d", registry=registry)(recorder(log, "l2"))
    register_filter("Relu", priority=1, name="off", description="d", registry=registry)(recorder(log, "off"))
    register_filter("Relu", priority=1, name="cuda", targets=["cuda"], description="d",
                    registry=registry)(recorder(log, "cuda"))
    register_filter("Relu", priority=1, name="on", description="d", registry=registry)(recorder(log, "on"))
    result = run_stage(ctx, PRE, registry=registry)
    assert log == [("on", "relu0")]
    skipped = {f["name"]: f.get("skipped") for f in result.data["filters"]}
    assert skipped["l2"] == "needs opt level 2, the run asked for 1"
    assert skipped["off"] == "disabled by the user"
    assert skipped["cuda"].startswith("bound to target(s) cuda, none of which is a valid place")
    assert skipped["on"] is None


def test_a_failing_filter_is_named_with_its_plugin_and_node(tmp_path, registry):
    ctx = context(tmp_path, chain("Relu"))

    @register_filter("Relu", priority=1, description="d", registry=registry)
    def broken(ctx, node):
        return node.attributes["missing"]

    with pytest.raises(InternalError, match=r"^filter 'broken' from test_plugin.py failed on node 'relu0' "
                                            r"\(Relu\): KeyError: 'missing'$") as error:
        run_stage(ctx, PRE, registry=registry)
    assert error.value.node.name == "relu0"  # a bug of the plugin: the stage fails soft, naming the node


def test_each_band_runs_only_its_priorities_and_bad_priorities_are_refused(tmp_path, registry):
    log = []
    for band in BANDS:
        for priority in (band.low, band.high - 1):
            register_filter(LAYER_FIRST, priority=priority, name=f"f{priority}", description="d",
                            registry=registry)(recorder(log, priority))
    for band in BANDS:
        log.clear()
        run_stage(context(tmp_path, chain("Relu")), band, registry=registry)
        assert log == [(band.low, "relu0"), (band.high - 1, "relu0")]
    with pytest.raises(ValueError, match=r"priority 500 is outside the filter bands \(PRE 0-199, SIMPLIFY 200-299"):
        register_filter("Relu", priority=500, description="d", registry=registry)(lambda c, n: False)
    with pytest.raises(ValueError, match="priority -1 is outside"):
        band_of(-1)


def test_the_default_pipeline_runs_the_stages_in_band_order_with_a_verified_graph(tmp_path):
    """Through the real registry and manager: pre-callback, then each band's filter, then the post-callback."""
    from worker.engine.passes.pipelines import get_pipeline
    from worker.engine.plugins.filters import FILTERS

    ctx = context(tmp_path, chain("Relu", "Neg"))
    log = []
    with REGISTRY.origin("stages_plugin.py"):
        register_pre_callback(name="t_pre", description="d")(lambda ctx: log.append("pre"))
        register_post_callback(name="t_post", description="d")(lambda ctx: log.append("post"))
        for band in reversed(BANDS):
            register_filter("Neg", priority=band.low + 1, name=f"t_{band.name}", description="d")(
                lambda ctx, node, band=band: log.append(band.name))
    try:
        trace = PassManager(instruments=[VerifyInstrument()]).run(ctx, get_pipeline("default").steps_for(ctx.options))
    finally:
        for name in ("t_pre", "t_post", *(f"t_{b.name}" for b in BANDS)):
            FILTERS.remove(name)
    assert log == ["pre", "PRE", "SIMPLIFY", "DOMAIN", "POST", "post"]
    stages = [e for e in trace if e["pass"].startswith("filter_")]
    assert [e["pass"] for e in stages] == [b.stage for b in BANDS]
    assert all(e["origin"] == "built-in" and e["filters"][0]["origin"] == "stages_plugin.py" for e in stages)
