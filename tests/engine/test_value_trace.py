"""Auto mixed precision's trace of every value in bounded memory: chunks of values, each a run of the nodes they
depend on, give the errors one run of everything gives."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from bench.amp import layernorm_with_large_variance
from tests.conftest import save_proto
from tests.engine.test_amp import PLACES
from worker.engine import numeric, value_trace
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.numeric import FP16_ATOL, FP16_MAX, FP16_RTOL, NOT_FINITE_ERROR

RNG = np.random.default_rng(11)


def moving_data():
    """MatMul, its result (beyond fp16's range) reshaped (data movement), then arithmetic again: values of 256 KiB."""
    w0 = helper.make_tensor("w0", TensorProto.FLOAT, [256, 256], (RNG.standard_normal((256, 256)) * 5000).ravel())
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [64, 64], (RNG.standard_normal((64, 64)) * 0.1).ravel())
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1024, 64])
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="embed"),
             helper.make_node("Reshape", ["h", "shape"], ["r"], name="reshape"),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0], name="transpose"),
             helper.make_node("MatMul", ["w1", "t"], ["u"], name="mix"),
             helper.make_node("Relu", ["u"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "moving", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 1024])], [w0, w1, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _models(tmp_path, model):
    """The input model and its build placed in fp16, as the trace loads them."""
    from worker.engine.ir import save_model
    from tests.engine.test_amp import _pinned

    source = save_proto(model, tmp_path / "in.onnx")
    built = tmp_path / "fp16.onnx"
    save_model(_pinned(source, set()).model, built)
    reference, candidate = (numeric._loaded(numeric._stored_in_fp16(str(p))) for p in (source, built))
    feeds = numeric._feeds(numeric._Inputs(reference), _shapes(model), np.random.default_rng(0))
    return reference, candidate, feeds


def _shapes(model):
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}


def _trace(reference, candidate, feeds, memory_mb, failure=lambda exc: False):
    shapes = {name: list(value.shape) for name, value in feeds.items()}
    return value_trace.traced_errors(reference, candidate, shapes, feeds, rtol=FP16_RTOL, atol=FP16_ATOL,
                                     memory_mb=memory_mb, fp16_max=FP16_MAX, not_finite=NOT_FINITE_ERROR,
                                     is_allocation_failure=failure)


@pytest.mark.parametrize("build", [layernorm_with_large_variance, moving_data])
def test_chunks_of_values_give_the_errors_of_one_run(tmp_path, build):
    reference, candidate, feeds = _models(tmp_path, build())
    whole = _trace(reference, candidate, feeds, memory_mb=0)
    assert whole["chunks"] == 1 and whole["errors"]
    chunked = _trace(reference, candidate, feeds, memory_mb=1)  # a third of a MiB per chunk: a few values each
    assert chunked["chunks"] >= 2
    moved = value_trace._moved_values(candidate)
    for name, error in whole["errors"].items():
        if name in moved:  # not run for: what it read carries
            assert chunked["errors"][name] == max(chunked["errors"][i] for i in moved[name] if i in chunked["errors"])
        else:
            assert chunked["errors"][name] == pytest.approx(error), name
    assert set(chunked["beyond_fp16"]) >= set(whole["beyond_fp16"]) and whole["beyond_fp16"]


def test_the_data_movement_values_are_run_for_when_everything_fits(tmp_path):
    reference, candidate, feeds = _models(tmp_path, moving_data())
    moved = value_trace._moved_values(candidate)
    assert "r" in moved and "h" not in moved  # the Reshape's output, through the Identities that store it
    assert "r" in _trace(reference, candidate, feeds, memory_mb=4096)["errors"]


def test_a_chunk_that_runs_out_of_memory_is_split(tmp_path, monkeypatch):
    """Sizes are estimates: a chunk onnxruntime cannot allocate is run again in halves, down to single values."""
    reference, candidate, feeds = _models(tmp_path, layernorm_with_large_variance())
    run = value_trace._run
    sizes = []

    def bounded(segments, names):
        sizes.append(len(names))
        if len(names) > 2:
            raise RuntimeError("BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer")
        return run(segments, names)

    monkeypatch.setattr(value_trace, "_run", bounded)
    is_failure = lambda exc: "Failed to allocate" in str(exc)  # noqa: E731
    split = _trace(reference, candidate, feeds, memory_mb=0, failure=is_failure)
    monkeypatch.setattr(value_trace, "_run", run)
    assert split["errors"] == pytest.approx(_trace(reference, candidate, feeds, memory_mb=0)["errors"])
    assert sizes[0] > 2 and max(sizes[1:]) < sizes[0]
    monkeypatch.setattr(value_trace, "_run", bounded)
    with pytest.raises(RuntimeError, match="Failed to allocate"):  # another failure is no reason to split
        _trace(reference, candidate, feeds, memory_mb=0)


def test_a_chunk_runs_only_the_nodes_its_values_depend_on_that_no_chunk_ran(tmp_path, monkeypatch):
    """Each node runs once: a later chunk's session is fed what earlier chunks computed (typed from the arrays:
    the input model declares no value's type), and the model is left as it was."""
    reference, _, feeds = _models(tmp_path, moving_data())
    assert not reference.graph.value_info
    sessions = []
    real = value_trace._Segments._run_nodes

    def recorded(self, needed, names):
        sessions.append(sorted(reference.graph.node[i].name for i in needed))
        return real(self, needed, names)

    monkeypatch.setattr(value_trace._Segments, "_run_nodes", recorded)
    segments = value_trace._Segments(reference, feeds, ["h", "r", "t", "u", "y"])
    assert set(segments.run(["h"])) == {"h"}
    assert set(segments.run(["u", "t", "r"])) == {"u", "t", "r"}
    chunked = segments.run(["y"])["y"]
    assert sessions == [["embed"], ["mix", "reshape", "transpose"], ["relu"]]
    assert not segments.kept  # nothing is held once no node or chunk still reads it
    np.testing.assert_array_equal(chunked, value_trace._Segments(reference, feeds, ["y"]).run(["y"])["y"])
    assert len(reference.graph.node) == 5 and [o.name for o in reference.graph.output] == ["y"]  # as it was
    assert [i.name for i in reference.graph.input] == ["x"]


def test_auto_mixed_precision_traces_within_the_verification_memory(tmp_path):
    """The fallback's trace goes through the child with the run's memory budget and finds the same nodes."""
    from worker.engine.limits import Limits

    source = save_proto(layernorm_with_large_variance(), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=PLACES, limits=Limits()))
    assert report["verification"]["passed"] is True and report["precision_fallback"]["nodes"]


def test_integer_values_are_compared_as_numbers_and_other_kinds_left_out():
    """A quantized value one step off is where an int8 kernel's rounding shows: it counts, in tolerances."""
    reference = np.array([3, -7, 127], np.int8)
    assert value_trace._error(reference, reference.copy(), 1e-4, 1e-5, NOT_FINITE_ERROR) == 0.0
    one_off = np.array([3, -6, 127], np.int8)
    assert value_trace._error(reference, one_off, 1e-4, 1e-5, NOT_FINITE_ERROR) == pytest.approx(1 / (1e-5 + 7e-4))
    flags = np.array([True, False])
    assert value_trace._error(flags, ~flags, 1e-4, 1e-5, NOT_FINITE_ERROR) is None
