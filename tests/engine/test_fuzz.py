"""The differential fuzzer (bench/fuzz.py): random valid graphs through optimize() compared with the input on
onnxruntime; every failure it ever saved (tests/engine/fuzz_regressions/) stays fixed; its shrinker finds the
node a failure needs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
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
