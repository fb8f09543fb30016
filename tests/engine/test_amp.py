"""Auto mixed precision: models that fail verification in fp16 come back verified with the fewest nodes in fp32."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from bench.amp import (bert_small, layernorm_with_large_variance, quantized_conv_chain, rounding_spread,
                       softmax_over_large_logits)
from tests.conftest import make_model, save_proto, tensor, vinfo
from tests.engine.passes.place.helpers import place_model
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.cli import build_parser, options_from_args
from worker.engine.errors import OptionsError, VerificationError
from worker.engine.ir import load_model, save_model
from worker.engine.numeric import FP16_ATOL, FP16_RTOL, verify
from worker.engine.passes.place.type_layout_cast import picked_name
from worker.engine.places import Precision

PLACES = "arm/fp16/nhwc,arm/fp32/nchw"
RNG = np.random.default_rng(3)


MODELS = {"softmax": softmax_over_large_logits, "layernorm": layernorm_with_large_variance}  # from bench/amp.py


def verifies(tmp_path, source, pinned: set[str], name: str, places: str = PLACES,
             tolerances: tuple[float, float] = (FP16_RTOL, FP16_ATOL)) -> bool:
    """The model placed with ``pinned`` nodes in fp32 verifies against ``source`` at ``tolerances`` (fp16's)."""
    ctx = _pinned(source, pinned, places)
    out = tmp_path / f"{name}.onnx"
    save_model(ctx.model, out)
    try:
        verify(str(source), str(out), rtol=tolerances[0], atol=tolerances[1])
        return True
    except VerificationError:
        return False


def _pinned(source, pinned, places: str = PLACES):
    from worker.engine.kernels import default_table
    from worker.engine.passes import PassContext, PassManager, get_pipeline
    from worker.engine.places import parse_places

    options = OptimizeOptions(places=places)
    ctx = PassContext(load_model(source), options, parse_places(places), kernels=default_table(),
                      pinned_fp32=frozenset(pinned))
    PassManager().run(ctx, get_pipeline("default").steps_for(options))
    return ctx


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_fails_in_fp16_without_the_fallback(tmp_path, kind):
    source = save_proto(MODELS[kind](), tmp_path / "in.onnx")
    with pytest.raises(VerificationError, match="does not compute what the input computed"):
        optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES, precision_fallback=False))
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_fallback_verifies_with_the_fewest_nodes_in_fp32(tmp_path, kind):
    source = save_proto(MODELS[kind](), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    assert report["verification"]["passed"] is True
    fallback = report["precision_fallback"]
    assert "does not compute what the input computed" in fallback["failure"]
    pinned = {n["node"] for n in fallback["nodes"]}
    assert pinned and all(n["place"] == "arm/fp32/nchw" and n["why"] for n in fallback["nodes"])
    assert fallback["runs"] == len(fallback["steps"]) and fallback["steps"][-1]["passed"] is not None
    # the pinned nodes compute in fp32 in the written model (the plan may move neighbours with them, where the
    # casts around a lone fp32 node would cost more than fp16 saves)
    written = load_model(tmp_path / "out.onnx")
    places = {picked_name(n): n.metadata.get("mirserve.place") for n in written.graph}
    assert all(places[name] == "arm/fp32/nchw" for name in pinned)
    assert len(pinned) < fallback["ranked"]  # fewer than every node that computed in fp16
    # fewest: with any one of them back in fp16 the model does not verify
    for name in pinned:
        assert not verifies(tmp_path, source, pinned - {name}, f"without-{name}"), name
    # and the summary says so
    assert report["summary"]["precision_fallback"]["nodes"] == sorted(pinned)
    assert report["summary"]["precision_fallback"]["precisions"] == ["fp16"]


def test_softmax_needs_its_logits_in_fp32_too(tmp_path):
    """Nothing after the logits can undo their rounding: the Gemm that computes them must be in fp32."""
    source = save_proto(softmax_over_large_logits(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    nodes = report["precision_fallback"]["nodes"]
    assert "Gemm" in {n["op"] for n in nodes}  # the logits' producer (MatMul + Add)


def test_pinned_nodes_take_no_fp16_kernel(tmp_path):
    source = save_proto(layernorm_with_large_variance(), tmp_path / "in.onnx")
    free = {n.name: n.pick.place.precision for n in place_model(source, PLACES, verify_ir=False).graph}
    assert free["add_beta"] is Precision.FP16 and free["sub"] is Precision.FP16
    pinned = {n.name: n.pick.place.precision for n in _pinned(source, {"add_beta", "sub"}).graph}
    assert pinned["add_beta"] is Precision.FP32 and pinned["sub"] is Precision.FP32
    assert pinned["project"] is Precision.FP16  # not pinned: as before


INT8_PLACES = "npu/int8/nchw,arm/fp32/nchw"


def test_int8_kernels_that_round_apart_from_the_float_reference_are_moved_back_to_fp32(tmp_path):
    """A QDQ model's Convs on the npu's QLinearConv round where the input computes in float: it does not verify
    (and --strict keeps the rewrite fallback from hiding it); auto mixed precision moves the fewest Convs back to
    the fp32 place, each with its Q/DQ sandwich, and says why."""
    source = save_proto(quantized_conv_chain(), tmp_path / "in.onnx")
    with pytest.raises(VerificationError, match="does not compute what the input computed"):
        optimize(source, tmp_path / "strict.onnx", OptimizeOptions(places=INT8_PLACES, strict=True,
                                                                    precision_fallback=False))
    free = {n.name: n.pick for n in place_model(source, INT8_PLACES, verify_ir=False).graph}
    assert {name for name, pick in free.items() if pick.absorbed} == {f"conv{i}_int8" for i in range(4)}

    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=INT8_PLACES, strict=True))
    assert report["verification"]["passed"] is True
    fallback = report["precision_fallback"]
    assert fallback["ranked"] == 4  # the four Convs: the Q/DQ nodes compute what the input's do
    pinned = {n["node"] for n in fallback["nodes"]}
    assert pinned and pinned < {f"conv{i}" for i in range(4)}
    assert all(n["place"] == "arm/fp32/nchw" and n["why"].startswith("in int8") for n in fallback["nodes"])
    assert fallback["precisions"] == report["summary"]["precision_fallback"]["precisions"] == ["int8"]
    written = load_model(tmp_path / "out.onnx")
    ops = {n.name: n.op_type for n in written.graph}
    assert all(ops.get(name) == "Conv" for name in pinned)  # float Convs between their DQ and Q
    assert {f"{name}_int8" for name in {f"conv{i}" for i in range(4)} - pinned} <= {
        name for name, op in ops.items() if op == "QLinearConv"}
    for name in pinned:  # fewest: each is needed
        assert not verifies(tmp_path, source, pinned - {name}, f"without-{name}", INT8_PLACES,
                            (report["verification"]["rtol"], report["verification"]["atol"])), name


@pytest.mark.models  # a bench architecture (bench/amp.py's encoder): 17 rebuilds and verifications
def test_a_bench_encoder_keeps_one_node_in_fp32(tmp_path):
    """bench/bert_base_graph.py's encoder, small (2 layers, hidden 64), its weights drawn by verification: in
    fp16 its pooled output does not verify; one node in fp32 is enough, and AMP finds it."""
    source = save_proto(bert_small(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    assert report["verification"]["passed"] is True
    fallback = report["precision_fallback"]
    assert len(fallback["nodes"]) == 1 and fallback["ranked"] > 50
    [kept] = fallback["nodes"]
    assert kept["place"] == "arm/fp32/nchw" and kept["why"]


def test_a_model_that_verifies_in_fp16_has_no_fallback(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = make_model(nodes, [vinfo("x", shape=[2, 8])], [vinfo("y", shape=[2, 4])],
                       [tensor("w", (RNG.standard_normal((8, 4)) * 0.1).astype(np.float32))])
    report = optimize(save_proto(model, tmp_path / "in.onnx"), tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    assert report["verification"]["passed"] is True and "precision_fallback" not in report


def test_the_option_and_the_flag():
    assert OptimizeOptions().precision_fallback is True
    assert OptimizeOptions.from_dict({"precision_fallback": False}).precision_fallback is False
    with pytest.raises(OptionsError, match="precision_fallback"):
        OptimizeOptions.from_dict({"precision_fallback": "no"})
    parser, _ = build_parser()
    args = parser.parse_args(["optimize", "m.onnx", "-o", "o.onnx", "--no-precision-fallback"])
    assert options_from_args(args).precision_fallback is False
    args = parser.parse_args(["optimize", "m.onnx", "-o", "o.onnx"])
    assert options_from_args(args).precision_fallback is True


def test_the_search_keeps_what_verified_last_when_its_steps_run_out(monkeypatch):
    from worker.engine import amp

    order = [amp.Ranked(f"n{i}", "Add", 10.0 - i, 10.0 - i) for i in range(10)]
    needed = {"n7"}  # ranked low: the prefix that verifies holds 8 pins, unpinning takes steps

    def trial(names):
        return needed <= set(names), ""

    full = amp.search(order, trial)
    assert [r.node for r in full.pinned] == ["n7"] and full.passed
    monkeypatch.setattr(amp, "MAX_STEPS", full.runs - 2)
    cut = amp.search(order, trial)
    assert cut.passed and cut.runs == full.runs - 2 and "n7" in {r.node for r in cut.pinned}
    assert len(cut.pinned) > 1  # more pins than needed, never a set that does not verify


def test_the_search_stops_starting_steps_when_its_time_is_spent():
    from worker.engine import amp

    order = [amp.Ranked(f"n{i}", "Add", 10.0 - i, 10.0 - i) for i in range(10)]
    outcome = amp.search(order, lambda names: ("n7" in names, ""), seconds=0.0)
    assert outcome.passed and outcome.runs == 1 and len(outcome.pinned) == 10  # all pinned verified: kept


def test_auto_mixed_precision_runs_on_a_model_verified_by_regions_when_both_fit_whole():
    """A model over 256 MiB is verified by regions, but auto mixed precision runs both models whole: it does so
    (a 275 MB wide ResNet-50 needed 65 nodes in fp32, 1.3 GB peak) while four times the weights fit the
    verification's memory, and says what to change when they do not."""
    from worker.engine.api import amp_fits, verify_chunk_bytes
    from worker.engine.limits import Limits

    wide_resnet = 275 << 20
    assert verify_chunk_bytes(wide_resnet, Limits()) > 0  # verified by regions
    assert amp_fits(wide_resnet, Limits())                 # 4096 MiB by default
    assert not amp_fits(wide_resnet, Limits(verify_memory_mb=1024))
    assert amp_fits(wide_resnet, Limits(verify_memory_mb=0))  # no bound


def test_the_search_never_tries_a_pin_set_twice():
    """Unpinning meets sets the bisection saw fail (a helper's sweep: 6 of fcn_resnet50's 40 steps, each a
    rebuild and a verification of the whole model): a set that failed is not tried again."""
    from worker.engine import amp

    order = [amp.Ranked(f"n{i}", "Conv", 100.0 - i, 100.0 - i) for i in range(72)]
    needed = {"n0", "n5", "n70"}  # one ranked low, as in fcn_resnet50
    tried = []

    def trial(names):
        tried.append(frozenset(names))
        return needed <= set(names), ""

    outcome = amp.search(order, trial)
    assert outcome.passed and {r.node for r in outcome.pinned} == needed
    assert len(tried) == len(set(tried)) == outcome.runs


def _loader(source):
    from worker.engine.kernels import default_table
    from worker.engine.passes import PassContext
    from worker.engine.places import parse_places

    options, table = OptimizeOptions(places=PLACES), default_table()
    return lambda pinned: PassContext(load_model(source), options, parse_places(PLACES), kernels=table,
                                      pinned_fp32=frozenset(pinned))


def _bytes(model) -> bytes:
    from worker.engine.ir import model_to_proto

    return model_to_proto(model).SerializeToString(deterministic=True)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_builds_from_one_run_of_the_passes_before_kernel_pick_equal_builds_from_the_file(tmp_path, kind):
    """Auto mixed precision's rebuilds run the passes before kernel pick once (they do not read the pins) and
    only placement, casts and the memory plan per step; each build is byte for byte what a run from the file
    gives, whichever builds came before it, with the same trace of passes."""
    from worker.engine.passes import PassManager, get_pipeline
    from worker.engine.pinned_builds import PinnedBuilds

    source = save_proto(MODELS[kind](), tmp_path / "in.onnx")
    load = _loader(source)
    steps = get_pipeline("default").steps_for(OptimizeOptions(places=PLACES))
    builds = PinnedBuilds(load, steps)
    everything = [picked_name(n) for n in _pinned(source, set()).graph if n.pick.place.precision is Precision.FP16]
    for pins in ([], everything, everything[:1], [], everything[1:]):
        model, ctx, trace, manager = builds(pins)
        save_model(model, tmp_path / "built.onnx")  # as a step saves it, between builds
        fresh = load(pins)
        fresh_trace = PassManager().run(fresh, steps)
        assert _bytes(model) == _bytes(fresh.model), pins
        assert [(e["pass"], e["rewrites"], e["skipped"]) for e in trace] == \
            [(e["pass"], e["rewrites"], e["skipped"]) for e in fresh_trace]
        assert ctx.report.keys() == fresh.report.keys() and ctx.pinned_fp32 == frozenset(pins)
    assert builds.starts == 1


def test_the_fallback_runs_the_passes_before_kernel_pick_twice_not_once_per_step(tmp_path, monkeypatch):
    """Once for the first build, once for every step's start: not once per step."""
    from worker.engine.passes import manager

    runs = []
    original = manager.PassManager._run_one

    def counting(self, ctx, pass_, *args, **kwargs):
        runs.append(pass_.name)
        return original(self, ctx, pass_, *args, **kwargs)

    monkeypatch.setattr(manager.PassManager, "_run_one", counting)
    source = save_proto(layernorm_with_large_variance(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    assert report["precision_fallback"]["runs"] > 2
    assert runs.count("support_check") == 2
    assert runs.count("static_kernel_pick") >= 1 + report["precision_fallback"]["runs"]  # every build picks


def test_kernel_pick_ranks_each_node_signature_once_over_all_the_builds(tmp_path, monkeypatch):
    """The rankings of node facts and the fp16 range of each weight do not depend on the pins: the builds of
    one search share them (``PassContext.memo``), and a build from the file starts without."""
    from worker.engine.passes import get_pipeline
    from worker.engine.passes.place import static_kernel_pick
    from worker.engine.pinned_builds import PinnedBuilds

    ranked, checked = [], []
    rank, fits = static_kernel_pick.rank, static_kernel_pick.fits_fp16
    monkeypatch.setattr(static_kernel_pick, "rank", lambda *a: ranked.append(a[1]) or rank(*a))
    monkeypatch.setattr(static_kernel_pick, "fits_fp16", lambda a: checked.append(a) or fits(a))
    source = save_proto(layernorm_with_large_variance(), tmp_path / "in.onnx")
    builds = PinnedBuilds(_loader(source), get_pipeline("default").steps_for(OptimizeOptions(places=PLACES)))
    builds(["sub"])
    first = len(ranked), len(checked)
    assert first[0] > 0 and first[1] > 0
    builds(["sub"])
    assert (len(ranked), len(checked)) == first  # nothing new to rank, no weight to check again
    builds([])  # only the signatures the other pins make (the greedy pick's inputs arrive otherwise)
    shared = len(ranked) - first[0]
    del ranked[:]
    _pinned(source, set())  # a build from the file: its own context ranks everything
    assert shared < len(ranked) / 4


def test_nodes_beyond_fp16s_range_are_the_first_guess_and_lose_by_placement_the_pins_it_does_not_need():
    """Where the input model's values leave fp16's range, the nodes touching them rank first and are pinned
    together at the second step; pins without which the model builds the same are dropped by builds, not
    verifications, and only the nodes after the block are bisected and unpinned by verification."""
    from worker.engine import amp

    block = [amp.Ranked(f"b{i}", "Conv" if i % 4 else "Concat", 0.0, amp.NOT_FINITE, True) for i in range(40)]
    rest = [amp.Ranked(f"r{i}", "Add", 5.0 - i / 10, 5.0) for i in range(20)]
    order = [*block, *rest]
    needed = {r.node for r in block if r.op == "Conv"} | {"r3"}
    placed_anyway = {r.node for r in block if r.op == "Concat"}  # the plan puts them in fp32 between convs
    tried, built = [], []

    def trial(names):
        tried.append(set(names))
        return needed <= set(names), ""

    def unchanged(pins, fewer):
        built.append(set(fewer))
        return set(pins) - set(fewer) <= placed_anyway

    outcome = amp.search(order, trial, unchanged=unchanged)
    assert outcome.passed and {r.node for r in outcome.pinned} == needed
    assert {r.node for r in outcome.unneeded} == placed_anyway
    assert tried[1] == {r.node for r in block}  # the first guess
    assert outcome.runs < 15 and len(built) <= amp.MAX_STEPS
    assert all(r.node in needed for r in outcome.pinned if r.beyond_fp16)
    # without ``unchanged`` (the baseline, a caller that cannot build) the search is the bisection it was
    plain = amp.search(order, trial)
    assert plain.passed and needed <= {r.node for r in plain.pinned} and not plain.unneeded


def test_nodes_touching_values_beyond_fp16s_range_rank_first(tmp_path):
    from worker.engine import amp

    source = save_proto(layernorm_with_large_variance(), tmp_path / "in.onnx")
    graph = _pinned(source, set()).graph
    plain = amp.rank(graph, {})
    ranked = amp.rank(graph, {}, {"d2"})  # the squares: Pow writes them, the variance's ReduceMean reads them
    assert [r.node for r in ranked[:2]] == [r.node for r in plain if r.node in ("pow", "var")]
    assert all(r.beyond_fp16 for r in ranked[:2]) and not any(r.beyond_fp16 for r in ranked[2:])
    assert [r.node for r in ranked[2:]] == [r.node for r in plain if r.node not in ("pow", "var")]
    assert "beyond fp16's range" in amp.describe(ranked[0])


@pytest.mark.models
def test_a_model_whose_values_overflow_fp16_nearly_everywhere_takes_a_few_steps(tmp_path):
    """The light zoo's SqueezeNet (constant weights: its values pass fp16's range a few layers in): the nodes
    touching those values, pinned together, verify at the second step; the Concats, the pooling and the
    Softmax among them are placed in fp32 anyway and lose their pins by builds. Before: 32 steps, 10 pins."""
    from tests.conftest import LIGHT

    report = optimize(LIGHT / "light_squeezenet.onnx", tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    fallback = report["precision_fallback"]
    assert report["verification"]["passed"] is True and fallback["runs"] <= 3
    assert len(fallback["nodes"]) == 10 and len(fallback["placement_only"]) == 5
    assert all("beyond fp16's range" in n["why"] and n["place"] == "arm/fp32/nchw" for n in fallback["nodes"])


def _additive(order, budget):
    """A trial where each node in fp16 adds its ``growth`` to the output's error, which verifies up to
    ``budget``: fp16's error by rounding, spread over the nodes."""
    total = sum(r.growth for r in order)
    tried = []

    def trial(names):
        tried.append(frozenset(names))
        return total - sum(r.growth for r in order if r.node in set(names)) <= budget, ""
    return trial, tried


def test_a_search_where_the_error_is_spread_over_most_nodes_ends_in_few_steps():
    """Rounding error spread over 80 nodes, four times the tolerance, ranked blind (as the max-ratio growth
    ranks DeepLabV3's convolutions): the output verifies with most nodes pinned, and proving each pin needed
    takes a verification each (the 40-step cap before). Unpinning stops once its tries mostly fail; the pins
    it kept are named as untried."""
    from worker.engine import amp

    rng = np.random.default_rng(7)
    errors = rng.uniform(0.5, 1.5, 80)
    order = [amp.Ranked(f"n{i}", "Conv", 0.0, float(e)) for i, e in enumerate(errors)]
    order = [amp.Ranked(r.node, r.op, r.error, r.error) for r in order]  # growth: what each adds
    trial, tried = _additive(order, errors.sum() / 4)
    outcome = amp.search([amp.Ranked(r.node, r.op, 0.0, r.error) for r in order], trial)
    assert outcome.passed and trial([r.node for r in outcome.pinned])[0]
    assert outcome.runs <= 16 and outcome.stopped and "failed" in outcome.stopped
    assert len(outcome.pinned) >= 60 and outcome.untried
    assert set(r.node for r in outcome.untried) <= set(r.node for r in outcome.pinned)
    assert "without being tried" in amp.describe(outcome.untried[0], untried=True)


def test_the_search_infers_what_fails_from_what_failed():
    """Pinning more never hurts, so fewer pins than a set that failed fail too: no step tries such a set (the
    node after the longest prefix that failed is needed, so unpinning a segment holding it takes no step).
    Six needed nodes ranked last of a long prefix: the segments holding them fail level after level, but the
    other segments pass, so unpinning goes on to the end and keeps exactly those six."""
    from worker.engine import amp

    order = [amp.Ranked(f"n{i}", "Add", 100.0 - i, 100.0 - i) for i in range(64)]
    needed = {f"n{i}" for i in range(54, 60)}
    tried = []

    def trial(names):
        tried.append(frozenset(names))
        return needed <= set(names), ""

    outcome = amp.search(order, trial)
    assert outcome.passed and {r.node for r in outcome.pinned} == needed and outcome.stopped is None
    failed = [t for t in tried if not needed <= t]
    assert not any(later <= earlier for i, earlier in enumerate(failed) for later in failed[i + 1:])


def test_fp16_rounding_spread_over_many_nodes_takes_few_steps(tmp_path):
    """bench/amp.py's chain of MatMuls, each adding about the same rounding error in fp16: the output verifies
    only with nearly every MatMul in fp32. The search finds it in few steps instead of bisecting and unpinning
    to the 40-step cap, and says which pins it kept untried."""
    source = save_proto(rounding_spread(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    assert report["verification"]["passed"] is True
    fallback = report["precision_fallback"]
    assert fallback["runs"] <= 16 and fallback["unpinning_stopped"]
    assert len(fallback["nodes"]) > fallback["ranked"] * 3 // 4
    assert any("without being tried" in n["why"] for n in fallback["nodes"])


def test_a_step_writes_its_candidate_in_the_form_verification_runs(tmp_path):
    """Each step's candidate is written with its fp16 values stored in fp16 (two Identities each) by the engine,
    as the verification child would rewrite it (parse, infer, serialize: most of a step on DeepLabV3), and
    the child loads it as it is; it computes what the child's rewrite computes."""
    import onnx

    from worker.engine import numeric
    from worker.engine.runtime import cpu_session

    source = save_proto(layernorm_with_large_variance(), tmp_path / "in.onnx")
    model = _pinned(source, {"sub"}).model
    plain, stored = tmp_path / "plain.onnx", tmp_path / "stored.onnx"
    save_model(model, plain)
    assert numeric.save_stored_in_fp16(model, stored) is True
    by_child = onnx.load_from_string(numeric._stored_in_fp16(str(plain)))
    written = onnx.load(str(stored))
    assert any(n.name.endswith("__stored_fp16") for n in written.graph.node)
    assert [(n.name, list(n.input), list(n.output)) for n in written.graph.node] == \
        [(n.name, list(n.input), list(n.output)) for n in by_child.graph.node]
    feeds = {"x": RNG.standard_normal((64, 256)).astype(np.float32)}
    [a], [b] = cpu_session(by_child.SerializeToString()).run(None, feeds), cpu_session(str(stored)).run(None, feeds)
    assert np.array_equal(a, b)
    # the child takes it as it is: no second rewrite (which would store each value twice)
    rewritten = []
    original = numeric._stored_in_fp16
    numeric._stored_in_fp16 = lambda path, *rest: rewritten.append(path) or original(path, *rest)
    try:
        request = {"mode": "verify", "reference": str(source), "candidate": str(stored), "runs": 1,
                   "rtol": FP16_RTOL, "atol": FP16_ATOL, "seed": 0, "chunk_bytes": 0, "same_weights": None,
                   "values": {}, "given": {}, "shape_sets": None, "candidate_stored": True}
        report = numeric._child(request)
    finally:
        numeric._stored_in_fp16 = original
    assert str(stored) not in rewritten and report["passed"] is not None


def test_a_model_that_leaves_a_value_undeclared_is_left_to_the_child():
    """The engine cannot infer the type of an undeclared value without the weights; the child, which has them,
    stores such a model's fp16 values itself."""
    from onnx import TensorProto

    from worker.engine import numeric

    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)]
    model = make_model(nodes, [vinfo("x", shape=[4])], [vinfo("y", shape=[4])])
    before = model.SerializeToString()
    assert numeric.store_fp16_values(model) is False and model.SerializeToString() == before
    model.graph.value_info.extend([vinfo("h", TensorProto.FLOAT16, [4]), vinfo("r", TensorProto.FLOAT16, [4])])
    assert numeric.store_fp16_values(model) is True
    assert [n.op_type for n in model.graph.node].count("Identity") == 4


def test_the_fallback_steps_verify_candidates_written_for_verification(tmp_path, monkeypatch):
    from worker.engine import api

    calls = []
    original = api.verify
    monkeypatch.setattr(api, "verify", lambda *a, **kw: calls.append(kw.get("candidate_stored")) or original(*a, **kw))
    source = save_proto(softmax_over_large_logits(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    runs = report["precision_fallback"]["runs"]
    assert runs > 1 and calls.count(True) == runs


def test_a_model_verified_by_regions_is_checked_after_the_fallback_as_its_search_checked_it(tmp_path, monkeypatch):
    """The search verifies each build whole, comparing outputs (both models fit: ``amp_fits``); the build it
    settles on is checked the same way. By regions, the check compared inner values the search never saw and
    failed builds whose outputs verify (torchvision ViT-B/32, 353 MB, under ``opencl/fp16/nchw``)."""
    from worker.engine import api

    chunks = []
    original = api.verify
    monkeypatch.setattr(api, "verify_chunk_bytes", lambda *a: 1 << 10)  # a small model verified by regions
    monkeypatch.setattr(api, "verify", lambda *a, **kw: chunks.append(kw.get("chunk_bytes")) or original(*a, **kw))
    source = save_proto(softmax_over_large_logits(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES))
    runs = report["precision_fallback"]["runs"]
    assert chunks[0] == 1 << 10 and chunks[1:] == [None] * runs + [0]  # regions first; whole after the fallback
    assert report["verification"]["passed"] is True and report["verification"]["method"] == "whole model"
