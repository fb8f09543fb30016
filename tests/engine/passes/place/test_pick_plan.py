"""The placement plan: exact on chains and trees, never worse than the greedy pick, casts counted as inserted."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from tests.conftest import CORPUS, CORPUS_SHAPES, light_models
from tests.engine.passes.place.helpers import casts, place_model, trace_entry
from worker.engine.kernels.cost import CostModelError, default_cost_model, parse_cost_model
from worker.engine.passes.support import pick_plan as plan, pick_search as search
from worker.engine.passes.support.casts import cast_kind
from worker.engine.places import Layout, Place, Precision, get_target

FP16, FP32, NHWC, NCHW = Precision.FP16, Precision.FP32, Layout.NHWC, Layout.NCHW
STATES = [("arm", FP16, NHWC), ("arm", FP32, NCHW), ("arm", FP16, NCHW), ("opencl", FP16, NCHW)]


@dataclass
class FakeValue:
    """What the plan reads of a value: its shape, rank and element type."""

    shape: tuple = (1, 8, 16, 16)
    dtype: int = 1

    @property
    def rank(self) -> int:
        return len(self.shape)


def option(state, cost: float) -> plan.Option:
    return plan.Option(None, cost, cost, state, (state,), (state,))


def problem(parents: list[list[int]], seed: int, states=STATES) -> plan.Problem:
    """Nodes 0..n-1 in order, node i reading the outputs of ``parents[i]`` (the graph input when empty); the
    nodes nobody reads are graph outputs. Every node has an option per state with a random cost."""
    rng = random.Random(seed)
    count = len(parents)
    options = [[option(s, rng.uniform(1000, 30000)) for s in rng.sample(states, rng.randint(1, len(states)))]
               for _ in range(count)]
    for node, sources in enumerate(parents):  # one input slot per parent
        for o in options[node]:
            o.inputs = tuple(o.inputs[0] for _ in sources or [None])
    read = {p for sources in parents for p in sources}
    host = Place(get_target("host"), FP32, NCHW)
    flows = [plan.Flow(FakeValue(), -1, 0, [(i, 0)], source=("host", FP32, NCHW))  # a graph input each
             for i, sources in enumerate(parents) if not sources]
    for node in range(count):
        consumers = [(c, slot) for c, sources in enumerate(parents) for slot, p in enumerate(sources) if p == node]
        flows.append(plan.Flow(FakeValue(), node, 0, consumers, None if node in read else host))
    return plan.Problem([None] * count, options, flows, default_cost_model())


def brute_force(p: plan.Problem) -> float:
    return min(p.total(list(c)) for c in itertools.product(*[range(len(o)) for o in p.options]))


@pytest.mark.parametrize("seed", range(6))
def test_chains_and_trees_are_solved_exactly(seed):
    chain = [[]] + [[i] for i in range(5)]
    tree = [[], [], [0, 1], [], [2, 3], [4]]  # two branches joined twice
    for parents in (chain, tree):
        p = problem(parents, seed)
        assert search.is_forest(p)
        assert p.total(search.solve_forest(p)) == pytest.approx(brute_force(p))


def test_a_value_read_twice_is_not_a_tree():
    assert not search.is_forest(problem([[], [0], [0], [1, 2]], 0))


@pytest.mark.parametrize("seed", range(8))
def test_minimum_cut_finds_the_best_binary_labels(seed):
    rng = random.Random(seed)
    count = 6
    unary = [[rng.uniform(0, 10), rng.uniform(0, 10)] for _ in range(count)]
    pairs = {}
    for i, j in itertools.combinations(range(count), 2):
        if rng.random() < 0.5:
            same, differ = rng.uniform(0, 3), rng.uniform(3, 9)  # submodular: agreeing costs less
            pairs[(i, j)] = [same, differ, differ + rng.uniform(0, 2), same]

    def energy(labels):
        total = sum(unary[i][x] for i, x in enumerate(labels))
        return total + sum(e[2 * labels[i] + labels[j]] for (i, j), e in pairs.items())

    labels = search._min_cut(count, unary, pairs)
    assert energy(labels) == pytest.approx(min(energy(c) for c in itertools.product((0, 1), repeat=count)))


@pytest.mark.parametrize("seed", range(6))
def test_the_local_search_never_ends_above_the_greedy_pick(seed):
    parents = [[], [0], [0], [1, 2], [3], [3], [4, 5], [6]]  # a diamond and a fork: no tree
    p = problem(parents, seed)
    greedy = [0] * len(parents)
    choice, figures = search.solve(p, greedy)
    assert figures.cost == pytest.approx(p.total(choice)) and figures.cost <= figures.greedy_cost
    assert figures.lower_bound <= figures.cost
    assert figures.casts["count"] <= figures.greedy_casts["count"]
    assert figures.casts["bytes"] <= figures.greedy_casts["bytes"]
    assert figures.cost >= brute_force(p) - 1e-6


def test_casts_are_counted_as_the_cast_passes_insert_them():
    value = FakeValue((1, 8, 4, 4))
    host = Place(get_target("host"), FP32, NCHW)
    flow = plan.Flow(value, 0, 0, [(1, 0), (2, 0), (3, 0)], host)
    demands = [("arm", FP32, NCHW), ("arm", FP32, NCHW), ("opencl", FP16, NHWC)]
    found = plan.casts_of(flow, ("arm", FP16, NHWC), demands)
    # one calib + one layout shared by both arm consumers; an io_copy alone for opencl (fp16 NHWC already);
    # the graph output shares the arm calib and layout cast (host and arm share memory)
    assert sorted(found) == [("calib", 128 * 4, "arm"), ("io_copy", 128 * 2, "opencl"), ("layout", 128 * 4, "arm")]
    # int64 data is never calibrated: no plan may ask for it
    assert plan.casts_of(plan.Flow(FakeValue((4,), 7), 0, 0, [(1, 0)]), ("arm", Precision.INT64, NCHW),
                         [("arm", FP16, NCHW)]) is None


def test_the_cost_model_is_data_with_clear_errors():
    model = default_cost_model()
    for target in ("host", "x86", "arm", "cuda", "opencl", "npu"):
        assert target in model.targets
    assert model.compute("arm", FP16, 1000, 0) < model.compute("arm", FP32, 1000, 0)
    assert model.compute("plugin_target", FP32, 10, 10) == model.compute("default", FP32, 10, 10)
    with pytest.raises(CostModelError, match="targets.arm.byte must be a non-negative number"):
        parse_cost_model({"targets": {"arm": {"mac": {"default": 1}, "byte": -1}}})
    with pytest.raises(CostModelError, match=r"no \[casts.calib\]"):
        parse_cost_model({"targets": {"default": {"mac": {"default": 1}, "byte": 1}},
                          "casts": {"io_copy": {"fixed": 1, "byte": 1}}})


def _inserted(ctx) -> dict:
    found: dict[str, int] = {}
    for node in casts(ctx.graph):
        found[cast_kind(node)] = found.get(cast_kind(node), 0) + 1
    return found


MODELS = [(CORPUS / name, CORPUS_SHAPES[name]) for name in CORPUS_SHAPES] + [(p, {}) for p in light_models()]


@pytest.mark.models
@pytest.mark.parametrize("places", ["arm/fp16/nhwc,arm/fp32/nchw", "opencl/fp16/nchw,arm/fp32/nchw"])
@pytest.mark.parametrize("path,shapes", MODELS, ids=[p.stem for p, _ in MODELS])
def test_the_plan_never_casts_more_than_the_greedy_pick_and_inserts_what_it_counted(path, shapes, places):
    ctx = place_model(path, places, shapes=shapes, verify_ir=False)
    figures = trace_entry(ctx, "static_kernel_pick")["plan"]
    assert figures == ctx.report["placement"]
    mine, greedy = figures["casts"], figures["greedy_casts"]
    assert mine["count"] <= greedy["count"] and mine["bytes"] <= greedy["bytes"]
    assert figures["lower_bound"] <= figures["cost"] <= figures["greedy_cost"]
    assert _inserted(ctx) == {kind: entry["count"] for kind, entry in mine["by_kind"].items()}


@pytest.mark.models
def test_the_plan_cuts_the_casts_of_the_detector():
    """Against Paddle-Lite's greedy pick on the same graph: fewer casts, and at least a quarter fewer bytes."""
    name = "ch_PP-OCRv4_det_infer.onnx"
    ctx = place_model(CORPUS / name, "arm/fp16/nhwc,arm/fp32/nchw", shapes=CORPUS_SHAPES[name], verify_ir=False)
    mine, greedy = ctx.report["placement"]["casts"], ctx.report["placement"]["greedy_casts"]
    assert mine["count"] < greedy["count"] and mine["bytes"] <= greedy["bytes"] * 0.75, (mine, greedy)


def _solved(monkeypatch) -> list:
    """The problems static_kernel_pick solves, as it solves them."""
    import worker.engine.passes.place.static_kernel_pick as pick_pass
    problems, solve = [], pick_pass.search.solve

    def spy(problem, greedy):
        problems.append(problem)
        return solve(problem, greedy)
    monkeypatch.setattr(pick_pass.search, "solve", spy)
    return problems


@pytest.mark.models
def test_the_classifiers_plan_is_the_minimum_over_every_placement(monkeypatch):
    """Its spatial mean runs as NHWC global pooling (a layout cast of the pooled [1, C, 1, 1] before the
    view to [N, C], not of the feature map before a host ReduceMean: the pooling and its Reshape are not made
    one reduction where the reduction's place is worse), and no choice of kernels costs less than the plan:
    the frontier DP, allowed all the work it needs, searches them all."""
    from worker.engine.passes.support import pick_frontier
    problems = _solved(monkeypatch)
    name = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    ctx = place_model(CORPUS / name, "arm/fp16/nhwc,arm/fp32/nchw", shapes=CORPUS_SHAPES[name], verify_ir=False)
    assert not ctx.graph.nodes_of_type("ReduceMean")
    [view] = [n for n in ctx.graph if n.op_type in ("Flatten", "Reshape") and n.output().rank == 2]
    layout = view.input(0).producer
    assert cast_kind(layout) == "layout" and all(d == 1 for d in layout.input(0).shape[1:3])  # NHWC [N, 1, 1, C]
    assert layout.input(0).producer.op_type == "NhwcGlobalAveragePool"
    figures = ctx.report["placement"]
    choice, cost = pick_frontier.solve_frontier(problems[0], work=10**7)
    assert cost == pytest.approx(problems[0].total(choice))
    assert figures["cost"] == pytest.approx(cost, abs=0.1)
    assert figures["casts"]["bytes"] <= figures["greedy_casts"]["bytes"]


@pytest.mark.models
def test_the_plan_is_deterministic():
    name = "ch_PP-OCRv4_det_infer.onnx"
    runs = [place_model(CORPUS / name, "arm/fp16/nhwc,arm/fp32/nchw", shapes=CORPUS_SHAPES[name], verify_ir=False)
            for _ in range(2)]
    picks = [[(n.name, n.metadata.get("mirserve.kernel"), n.metadata.get("mirserve.place")) for n in ctx.graph]
             for ctx in runs]
    assert picks[0] == picks[1]
    assert runs[0].report["placement"]["cost"] == runs[1].report["placement"]["cost"]


def test_equal_costs_go_to_the_place_the_user_listed_first():
    first, second = ("arm", FP16, NCHW), ("arm", FP32, NCHW)
    options = [plan.Option(None, 500.0 + plan.TIE * rank, 500.0, state, (state,), (state,))
               for rank, state in ((1, second), (0, first))]  # the greedy pick (index 0) is the second place
    p = plan.Problem([None], [options], [plan.Flow(FakeValue((4, 4)), 0, 0, [], None)], default_cost_model())
    choice, figures = search.solve(p, [0])
    assert options[choice[0]].place == first and figures.cost < figures.greedy_cost


def test_a_plugin_states_its_targets_cost():
    from worker.engine.kernels.cost import register_target_cost, unregister_target_cost
    assert default_cost_model().target("made_up_npu") is default_cost_model().targets["default"]
    register_target_cost("made_up_npu", {"mac": {"default": 0.001}, "byte": 0.01, "io_copy": {"fixed": 5, "byte": 0}})
    try:
        model = default_cost_model()
        assert model.compute("made_up_npu", FP16, 1000, 0) == pytest.approx(1.0)
        assert model.cast("io_copy", 10**6, "made_up_npu") == 5 and model.cast("io_copy", 10**6) > 5
    finally:
        unregister_target_cost("made_up_npu")
    assert "made_up_npu" not in default_cost_model().targets
    with pytest.raises(CostModelError, match="targets.bad.mac must be a table with a 'default' figure"):
        register_target_cost("bad", {"mac": {"fp16": 1}, "byte": 1})


def test_a_value_an_if_body_reads_is_costed_with_the_calib_it_gets(tmp_path):
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper
    from tests.conftest import make_model, save_proto, vinfo
    from worker.engine.ir import save_model
    size = 65536  # big enough that the Relu pays for its calibs on arm in fp16
    then_graph = helper.make_graph([helper.make_node("Neg", ["r"], ["t"])], "then", [], [vinfo("t", shape=[size])])
    else_graph = helper.make_graph([helper.make_node("Abs", ["r"], ["e"])], "else", [], [vinfo("e", shape=[size])])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),  # fp16 on arm: the bodies read it as float
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    source = save_proto(make_model(nodes, [vinfo("x", shape=[size])], [vinfo("y", shape=[size])], [zero]),
                        tmp_path / "if.onnx")
    ctx = place_model(source, "arm/fp16/nchw")
    relu = ctx.graph.nodes_of_type("Relu")[0]
    assert relu.metadata["mirserve.place"] == "arm/fp16/nchw"
    if_node = ctx.graph.nodes_of_type("If")[0]
    assert any(cast_kind(n) == "calib" and n.input(0) is relu.output() for n in ctx.graph)  # before the If
    planned = {kind: entry["count"] for kind, entry in ctx.report["placement"]["casts"]["by_kind"].items()}
    assert _inserted(ctx) == planned == {"calib": 2} and if_node is not None
    save_model(ctx.model, tmp_path / "out.onnx")
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    got = onnxruntime.InferenceSession(str(tmp_path / "out.onnx")).run(None, {"x": x})[0]
    want = -np.maximum(x, 0) if x.sum() > 0 else np.abs(np.maximum(x, 0))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def _qdq_conv_model(tmp_path):
    """x -> Q -> DQ -> Conv (DQ int8 weights) -> Q -> DQ -> + DQ(x): an int8 sandwich whose input is also read
    in float (by the Add), so one DequantizeLinear is absorbed for one consumer and stays for the other."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from tests.conftest import make_model, save_proto, vinfo
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(0.05, np.float32), "s2"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(rng.integers(-20, 20, (8, 8, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.array(0.01, np.float32), "ws")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "z"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s2", "z"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s2", "z"], ["cd"]),
             helper.make_node("Add", ["cd", "xd"], ["y"])]
    shape = [1, 8, 16, 16]
    return save_proto(make_model(nodes, [vinfo("x", shape=shape)], [vinfo("y", shape=shape)], inits,
                                 opset=13), tmp_path / "qdq.onnx")


@pytest.mark.parametrize("places", ["arm/int8/nchw,arm/fp32/nchw", "arm/int8/nchw", "npu/int8/nchw,arm/fp32/nchw",
                                    "arm/fp16/nhwc,arm/int8/nchw,arm/fp32/nchw"])
def test_an_int8_kernel_that_absorbs_its_quantize_pair_is_priced(tmp_path, places):
    """The QLinearConv that replaces DQ -> Conv -> Q reads and writes none of the Conv's float values: the plan
    prices those edges as the cast passes realise them (no cast), where it once found no cast chain for the
    DQ's fp32 output into an int8 port and reported the whole plan as not priced."""
    import numpy as np
    import onnxruntime
    from worker.engine.ir import save_model
    source = _qdq_conv_model(tmp_path)
    ctx = place_model(source, places)
    assert len(ctx.graph.nodes_of_type("QLinearConv")) == 1 and not ctx.graph.nodes_of_type("Conv")
    figures = ctx.report["placement"]
    assert None not in (figures["cost"], figures["greedy_cost"], figures["casts"]["cost"])
    assert figures["lower_bound"] <= figures["cost"] <= figures["greedy_cost"]
    assert _inserted(ctx) == {kind: entry["count"] for kind, entry in figures["casts"]["by_kind"].items()}
    save_model(ctx.model, tmp_path / "out.onnx")
    x = {"x": np.random.default_rng(1).uniform(-1, 1, (1, 8, 16, 16)).astype(np.float32)}
    want = onnxruntime.InferenceSession(str(source)).run(None, x)[0]
    got = onnxruntime.InferenceSession(str(tmp_path / "out.onnx")).run(None, x)[0]
    np.testing.assert_allclose(got, want, atol=0.06)  # one quantization step of the output


@pytest.mark.models
@pytest.mark.parametrize("places", ["arm/int8/nchw,arm/fp32/nchw", "npu/int8/nchw,arm/fp32/nchw"])
def test_the_quantized_classifier_is_priced_on_int8_places(places):
    name = "cls_qdq.onnx"
    ctx = place_model(CORPUS / name, places, shapes=CORPUS_SHAPES[name], verify_ir=False)
    figures = ctx.report["placement"]
    assert ctx.graph.nodes_of_type("QLinearConv")
    assert None not in (figures["cost"], figures["greedy_cost"], figures["casts"]["cost"])
    assert figures["lower_bound"] <= figures["cost"] <= figures["greedy_cost"]
    assert _inserted(ctx) == {kind: entry["count"] for kind, entry in figures["casts"]["by_kind"].items()}


DAGS = [[[], [0], [0], [1, 2], [3], [3], [4, 5], [6]],            # a diamond and a fork
        [[], [0], [1], [0, 2], [3], [3, 4], [5], [4, 6]],           # residual branches, one value read thrice
        [[], [], [0, 1], [0], [2, 3], [1, 4]]]                       # two inputs, long-lived values


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("parents", DAGS, ids=["diamond", "residual", "two_inputs"])
def test_the_frontier_dp_finds_the_minimum_of_any_small_graph(seed, parents):
    from worker.engine.passes.support import pick_frontier
    p = problem(parents, seed)
    assert not search.is_forest(p)
    choice, cost = pick_frontier.solve_frontier(p)
    assert cost == pytest.approx(p.total(choice)) == pytest.approx(brute_force(p))


def test_the_frontier_dp_declines_a_graph_past_its_bound_of_work():
    from worker.engine.passes.support import pick_frontier
    many = [[]] + [[0] for _ in range(12)] + [list(range(1, 13))]  # twelve values open at once
    p = problem(many, 0)
    assert pick_frontier.work_bound(p) > pick_frontier.WORK and pick_frontier.solve_frontier(p) is None
    choice, figures = search.solve(p, [0] * len(many))
    assert figures.method.startswith("local search") and figures.cost <= figures.greedy_cost


@pytest.mark.parametrize("seed", range(6))
def test_solve_is_exact_on_a_small_graph_unless_the_minimum_casts_more_than_the_greedy_pick(seed):
    from worker.engine.passes.support import pick_frontier
    p = problem(DAGS[1], seed)
    greedy = [0] * len(DAGS[1])
    choice, figures = search.solve(p, greedy)
    exact, _ = pick_frontier.solve_frontier(p)
    (count, size), (greedy_count, greedy_size) = p.cast_load(exact), p.cast_load(greedy)
    if count <= greedy_count and size <= greedy_size:  # the plan may not cast more than the greedy pick
        assert figures.method == "exact (dynamic programming over the open values)"
        assert figures.cost == pytest.approx(brute_force(p))
    else:
        assert figures.method.startswith("local search")
