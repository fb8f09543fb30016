"""Verification by regions on small onnx.helper models: the boundary values a region draws must be ones the
input model could give it together. A boundary the original computes from another boundary of the region
(torchvision's ViT keys, (seq, batch * heads, size) viewed as (batch, heads, seq, size)) is grown through when
one side reads the source and the other the derived value, or random draws of both fail a correct rewrite."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from worker.engine import regions
from worker.engine.chunked import ChunkedSession
from worker.engine.numeric import _compare
from worker.engine.regions import RegionPlan, verify_regions

SHAPES = [{"x": [4, 6, 8]}]


def _model(path: Path, tail: list) -> Path:
    """x (4, 6, 8) scaled by a weight -> t = Transpose (6, 4, 8) -> y = Reshape (2, 3, 4, 8); ``tail`` makes
    ``out`` (6, 8, 4); ``dims`` = Shape(y) is a second output, so both models compute y."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["scaled"]),
             helper.make_node("Transpose", ["scaled"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "heads"], ["y"]),
             helper.make_node("Shape", ["y"], ["dims"]), *tail]
    graph = helper.make_graph(
        nodes, "keys", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [6, 8, 4]),
         helper.make_tensor_value_info("dims", TensorProto.INT64, [4])],
        [onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "w"),
         onnx.numpy_helper.from_array(np.array([-1, 3, 4, 8], np.int64), "heads"),
         onnx.numpy_helper.from_array(np.array([-1, 4, 8], np.int64), "flat"),
         onnx.numpy_helper.from_array(np.array(-1.0, np.float32), "minus")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


# the original: the keys read back from y through a Reshape, then transposed
ORIGINAL = [helper.make_node("Reshape", ["y", "flat"], ["z"]),
            helper.make_node("Transpose", ["z"], ["out"], perm=[0, 2, 1])]
# the rewrite: one Transpose of the scaled input (the two Reshapes between cancel): the same values
REWRITTEN = [helper.make_node("Transpose", ["scaled"], ["out"], perm=[1, 2, 0])]
# a wrong one: the same, negated
WRONG = [helper.make_node("Transpose", ["scaled"], ["negated"], perm=[1, 2, 0]),
         helper.make_node("Mul", ["negated", "minus"], ["out"])]


def _verify(tmp_path: Path, tail: list, monkeypatch) -> dict:
    # every node reading a weight is left out of the prefix (the real ones read a projection over 4 MiB), so
    # the scaled input and y are drawn, not computed from x
    monkeypatch.setattr(regions, "PREFIX_WEIGHT", 0)
    original = ChunkedSession(_model(tmp_path / "original.onnx", ORIGINAL), 1 << 20)
    candidate = ChunkedSession(_model(tmp_path / "candidate.onnx", tail), 1 << 20)
    plan = RegionPlan(original, candidate, {}, SHAPES, 1 << 20)
    feeds = lambda shapes, rng: {"x": rng.random(shapes["x"], dtype=np.float32)}  # noqa: E731
    return {**verify_regions(plan, feeds, SHAPES, runs=2, seed=0, rtol=1e-4, atol=1e-5, compare=_compare),
            "boundary": sorted(b for r in plan.regions for b in r.boundary)}


def test_a_derived_boundary_is_grown_through_to_its_source(tmp_path, monkeypatch):
    found = _verify(tmp_path, REWRITTEN, monkeypatch)
    assert found["boundary"] == ["scaled"]  # not y, which the original computes from it
    assert found["passed"] is True and found["regions"] == 1


def test_a_wrong_rewrite_over_the_same_boundary_is_still_caught(tmp_path, monkeypatch):
    found = _verify(tmp_path, WRONG, monkeypatch)
    assert found["passed"] is False and found["boundary"] == ["scaled"]
