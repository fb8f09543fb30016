"""Verification of models larger than memory: ``ChunkedSession`` runs a model a slice of its weights at a time
and must compute what one onnxruntime session computes; ``optimize`` switches to it when the weights exceed a
quarter of verification's memory budget."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import CORPUS
from worker.engine import api
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.chunked import ChunkedSession, NotChunkable
from worker.engine.limits import Limits


pytestmark = pytest.mark.models


def _whole(path: Path, feeds: dict) -> list:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_bert_in_pieces_computes_what_one_session_computes():
    """fp32, 21 MB of weights in pieces of at most 1 MB: the same outputs to float rounding."""
    path = CORPUS / "bert_small_dyn.onnx"
    session = ChunkedSession(path, budget=1 << 20)
    assert len(session.pieces) > 10
    rng = np.random.default_rng(0)
    feeds = {}
    for item in session.get_inputs():
        dims = [d if isinstance(d, int) else (2 if i == 0 else 16) for i, d in enumerate(item.shape)]
        feeds[item.name] = rng.integers(0, 2, dims).astype(np.int64)
    for a, b in zip(session.run(None, feeds), _whole(path, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_llama_in_pieces_computes_what_one_session_computes(llama):
    session = ChunkedSession(llama, budget=100_000)
    weights = max(v.nbytes for v in session.graph.initializers.values())
    assert len(session.pieces) > 10 and all(
        sum(v.nbytes for v in piece.constants) <= max(100_000, weights) for piece in session.pieces)
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 1000, (2, 16)).astype(np.int64)}
    [chunked], [whole] = session.run(None, feeds), _whole(llama, feeds)
    assert chunked.dtype == np.float16 and chunked.shape == (2, 16, 1000)
    np.testing.assert_allclose(chunked.astype(np.float32), whole.astype(np.float32), rtol=1e-2, atol=2e-3)


def test_the_budget_decides_when_verification_goes_in_pieces():
    assert api.verify_chunk_bytes(200 << 20, Limits(verify_memory_mb=4096)) == 0
    assert api.verify_chunk_bytes(300 << 20, Limits(verify_memory_mb=4096)) == api.VERIFY_CHUNK_BYTES
    assert api.verify_chunk_bytes(300 << 20, Limits(verify_memory_mb=512)) == 128 << 20


def test_optimize_verifies_a_model_beyond_its_budget_in_pieces_and_catches_a_wrong_one(llama, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setattr(api, "verify_chunk_bytes", lambda input_bytes, limits: 1 << 20)
    options = OptimizeOptions(places="arm/fp16/nchw,arm/fp32/nchw")
    report = optimize(llama, tmp_path / "out.onnx", options, external_data_dir=llama.parent)
    verification = report["verification"]
    assert verification["passed"] is True and verification["pieces_of_mb"] == 1
    # a candidate with one weight changed fails, in pieces too
    from worker.engine.numeric import verify
    from worker.engine.errors import VerificationError

    broken = onnx.load(str(llama))
    weight = next(t for t in broken.graph.initializer if t.name.endswith("down_proj.weight"))
    array = onnx.numpy_helper.to_array(weight, base_dir=str(llama.parent)) * np.float16(3)
    weight.CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
    onnx.save(broken, str(tmp_path / "broken.onnx"), save_as_external_data=True, location="broken.data")
    with pytest.raises(VerificationError, match="does not compute what the input computed"):
        verify(str(llama), str(tmp_path / "broken.onnx"), rtol=1e-2, atol=1e-3, chunk_bytes=1 << 20)


def test_a_model_with_a_subgraph_is_not_cut(tmp_path):
    from onnx import TensorProto, helper

    body = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "b", [],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body)], "g",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    with pytest.raises(NotChunkable, match="subgraph"):
        ChunkedSession(tmp_path / "m.onnx")
