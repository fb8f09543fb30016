"""The differential fuzzer (bench/fuzz.py): random valid graphs through optimize() compared with the input on
onnxruntime; every failure it ever saved (tests/engine/fuzz_regressions/) stays fixed; its shrinker finds the
node a failure needs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest

import bench.fuzz as fuzz

SAVED = sorted(fuzz.REGRESSIONS.glob("*.onnx")) if fuzz.REGRESSIONS.is_dir() else []


@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_a_saved_failure_stays_fixed(path: Path):
    outcome, detail = fuzz.check_saved(path)
    assert outcome in ("ok", "refused"), f"{outcome}: {detail}"


def test_graphs_are_reproducible_from_seed_and_index():
    assert fuzz.generate(3, 14).SerializeToString() == fuzz.generate(3, 14).SerializeToString()
    assert fuzz.generate(3, 14).SerializeToString() != fuzz.generate(3, 15).SerializeToString()
    assert fuzz.draw_options(3, 14) == fuzz.draw_options(3, 14)


@pytest.mark.parametrize("index", range(24))
def test_a_few_random_graphs_optimize_to_what_they_compute(index):
    result = fuzz.run_one(0, index)
    assert result.outcome in ("ok", "refused"), f"{result.outcome}: {result.detail} ({result.options})"


@pytest.mark.models
def test_three_hundred_random_graphs_optimize_to_what_they_compute():
    results = [fuzz.run_one(2, index) for index in range(300)]
    failures = [f"graph {r.index} {r.options}: {r.outcome}: {r.detail}" for r in results if r.failed]
    assert not failures, "\n".join(failures)
    assert sum(r.outcome == "invalid" for r in results) <= 3  # the generator makes valid graphs


def test_the_shrinker_keeps_only_what_the_failure_needs(monkeypatch, tmp_path):
    """A planted failure (any model with a Tanh 'mismatches'): shrinking a random graph around it leaves
    the Tanh and nothing else but what feeds it."""
    def planted(model, options, workdir, seed=0):
        return ("mismatch", "planted") if any(n.op_type == "Tanh" for n in model.graph.node) else ("ok", "")

    monkeypatch.setattr(fuzz, "check", planted)
    model = fuzz.generate(5, 3)
    last = model.graph.output[0]
    tanh = onnx.helper.make_node("Tanh", [last.name], ["planted"])
    model.graph.node.append(tanh)
    planted_output = onnx.ValueInfoProto()
    planted_output.CopyFrom(last)
    planted_output.name = "planted"
    model.graph.output.append(planted_output)
    if last.type.tensor_type.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        pytest.skip("the graph's last output is not a float")
    shrunk = fuzz.shrink(model, {"places": "x86/fp32/nchw", "opt_level": 2, "portable": False}, "mismatch", 0)
    assert [n.op_type for n in shrunk.graph.node] == ["Tanh"]
    assert len(shrunk.graph.input) == 1 and len(shrunk.graph.output) == 1

    saved = fuzz.save_regression(shrunk, fuzz.Result(5, 3, "mismatch", "planted", options={
        "places": "x86/fp32/nchw", "opt_level": 2, "portable": False}), tmp_path)
    assert saved.exists() and saved.with_suffix(".json").exists()
    assert fuzz.check_saved(saved) == ("mismatch", "planted")


def test_fp16_places_are_compared_at_fp16_rounding_and_range():
    expected = np.array([1.0, 100.0, 1e6, -3.0], np.float32)
    rounded = np.array([1.001, 100.5, np.inf, -3.0], np.float32)
    assert fuzz.compare(expected, rounded, half=True) is None
    assert fuzz.compare(expected, rounded, half=False) is not None
    assert "differ" in fuzz.compare(expected, np.array([1.0, 100.0, 1e6, 3.0], np.float32), half=True)


def test_fp32_places_may_compute_an_fp16_model_in_fp32_but_no_further():
    """fp32 places run an fp16 model's values in fp32 (a calib in, the Cast out converts nothing): allowed
    within twice what fp32 moves each element from the fp16 result, not beyond (fuzz graph 2334)."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
        g (float16[3] x) => (float y) {
            s = Sub (x, c)
            y = Cast <to: int = 1> (s)
        }""")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0.3, 1.7, -2.9], np.float16), "c"))
    feeds = {"x": np.array([1.001, -0.333, 7.77], np.float16)}
    from worker.engine.numeric import _stored_in_fp16

    expected = np.asarray(fuzz._session(_stored_in_fp16(model.SerializeToString())).run(None, feeds)[0])
    in_fp32 = np.asarray(fuzz._run_in_fp32(model, feeds)[0])
    exact = (feeds["x"].astype(np.float32) - np.array([0.3, 1.7, -2.9], np.float16).astype(np.float32))
    assert np.array_equal(in_fp32, exact) and not np.array_equal(expected, exact)  # fp16 rounded the Sub
    assert fuzz.compare(expected, in_fp32, half=False) is not None
    assert fuzz.compare(expected, in_fp32, half=False, in_fp32=in_fp32) is None
    beyond = expected + 3 * (in_fp32 - expected) + np.sign(in_fp32 - expected) * 1e-3
    assert "differ" in fuzz.compare(expected, beyond, half=False, in_fp32=in_fp32)


def test_an_fp32_model_has_no_fp32_reference():
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[2] x) => (float y) { y = Relu (x) }""")
    assert fuzz._fp32_everywhere(model) is None
    assert fuzz._run_in_fp32(model, {"x": np.ones(2, np.float32)}) == [None]


def test_an_output_widening_an_fp16_value_must_hold_fp16_values():
    """out = Cast(Cast(fp16 -> float) -> double) holds fp16 values in the input model: computing them in fp32 is
    allowed within what that moves them, but an element that is no fp16 value lost the model's rounding (fuzz
    graph 9755); plain (Tanh of a float) is no widened fp16 value, nor is one that went through an integer."""
    half = onnx.TensorProto.FLOAT16
    nodes = [onnx.helper.make_node("Tanh", ["x"], ["t"]),
             onnx.helper.make_node("Cast", ["t"], ["f"], to=onnx.TensorProto.FLOAT),
             onnx.helper.make_node("Cast", ["f"], ["out"], to=onnx.TensorProto.DOUBLE),
             onnx.helper.make_node("Tanh", ["z"], ["plain"])]
    inputs = [onnx.helper.make_tensor_value_info("x", half, [3]), onnx.helper.make_tensor_value_info("z", 1, [3])]
    outputs = [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.DOUBLE, [3]),
               onnx.helper.make_tensor_value_info("plain", 1, [3])]
    assert fuzz._widened_fp16(onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", inputs, outputs))) == {"out"}
    nodes[1] = onnx.helper.make_node("Cast", ["t"], ["f"], to=onnx.TensorProto.INT32)
    assert fuzz._widened_fp16(onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", inputs, outputs))) == set()

    expected = np.array([0.73046875, -0.5, 0.25])                       # fp16 values
    unrounded = np.array([0.7306472063064575, -0.5, 0.25])              # what graph 9755 gave
    in_fp32 = unrounded                                                 # the input computed in fp32
    assert fuzz.compare(expected, unrounded, half=False, in_fp32=in_fp32) is None
    assert "not fp16 values" in fuzz.compare(expected, unrounded, half=False, in_fp32=in_fp32, fp16_values=True)
    rounded = np.array([0.73046875, -0.5, 0.25])
    assert fuzz.compare(expected, rounded, half=False, in_fp32=in_fp32, fp16_values=True) is None
