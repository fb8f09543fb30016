"""Verification by regions (issue 13): a model over the chunked threshold is compared with its input only where
the two graphs differ. A small Llama from bench/make_llama.py, with the threshold lowered so that it counts as
large: the real rewrites verify, a wrong one is caught in its region, a renamed value is paired through or
grows its region, and what cannot be matched falls back to the whole models."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from worker.engine import api
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.errors import VerificationError
from worker.engine.numeric import verify

pytestmark = pytest.mark.models
PIECE = 1 << 20
FUSING = "host/fp16/nchw"  # keeps the fp16 weights as they are and fuses RMSNorm, SiLU and rotate-half


@pytest.fixture
def large(monkeypatch):
    """Every model counts as larger than memory: verification goes in pieces of 1 MiB, by regions."""
    monkeypatch.setattr(api, "verify_chunk_bytes", lambda input_bytes, limits: PIECE)


def _optimize(llama: Path, out: Path, places: str, **options) -> dict:
    return optimize(llama, out, OptimizeOptions(places=places, **options),
                    external_data_dir=llama.parent)["verification"]


@pytest.mark.parametrize("opset, fused", [(None, {"RMSNorm", "FusedMatMulSilu", "Split"}),
                                          (23, {"RMSNormalization", "Attention"})])
def test_the_fusions_are_verified_region_by_region(llama, tmp_path, large, opset, fused):
    verification = _optimize(llama, tmp_path / "out.onnx", FUSING, target_opset=opset)
    assert verification["passed"] is True and verification["method"] == "regions"
    assert fused <= set(verification["region_ops"])
    # only where the graphs differ: a fraction of the nodes, every region's values compared
    assert 0 < verification["region_nodes"] < verification["nodes"] / 2
    assert verification["summary"].startswith(f"verified by regions: {verification['regions']} regions, "
                                              f"{verification['region_nodes']} of {verification['nodes']} nodes")
    assert {o["region"] for o in verification["outputs"]} == set(range(verification["regions"]))
    assert verification["shapes"] == [{"input_ids": [1, 16]}, {"input_ids": [2, 16]}]
    summary = optimize(llama, tmp_path / "again.onnx", OptimizeOptions(places=FUSING),
                       external_data_dir=llama.parent)["summary"]
    assert summary["verification"]["method"] == "regions"


def test_a_small_model_is_still_verified_whole(llama, tmp_path):
    verification = _optimize(llama, tmp_path / "out.onnx", FUSING)
    assert verification["passed"] is True and verification["method"] == "whole model"
    assert "regions" not in verification


def test_a_wrong_epsilon_is_caught_in_its_region(llama, tmp_path, large, monkeypatch):
    from worker.engine.passes.mirserve_fuse import transformer_domain_fuse

    real = transformer_domain_fuse.scalar
    monkeypatch.setattr(transformer_domain_fuse, "scalar", lambda value: real(value) + 0.1)
    with pytest.raises(VerificationError, match=r"value '/model/[^']*norm/Mul_\d+_output_0' differs .* region \d+ "
                                                r"\(RMSNorm in the optimized model"):
        _optimize(llama, tmp_path / "out.onnx", FUSING)
    assert not (tmp_path / "out.onnx").exists()


def _rewrite(llama: Path, out: Path, edit) -> Path:
    """A copy of the Llama with ``edit(graph)`` applied, its weights in a data file of its own."""
    model = onnx.load(str(llama))
    edit(model.graph)
    onnx.save(model, str(out), save_as_external_data=True, location=out.name + ".data")
    return out


def _rename(graph, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for value in graph.output:
        if value.name == old:
            value.name = new


def _verify(llama: Path, candidate: Path) -> dict:
    # no weight known to be untouched: those of this Llama are under a MiB each, compared byte for byte
    return verify(str(llama), str(candidate), rtol=1e-2, atol=1e-3, chunk_bytes=PIECE, same_weights={},
                  shape_sets=[{"input_ids": [1, 16]}], shapes_checked=False)


def _neg(graph, layer: int = 0):
    return next(n for n in graph.node if n.op_type == "Neg" and f"layers.{layer}/" in n.name)


def test_a_renamed_value_is_paired_through_its_readers(llama, tmp_path):
    def edit(graph):
        _rename(graph, _neg(graph).output[0], "renamed")

    verification = _verify(llama, _rewrite(llama, tmp_path / "renamed.onnx", edit))
    assert verification["passed"] is True and verification["method"] == "regions"
    assert verification["regions"] == 0 and verification["matched_nodes"] == verification["nodes"]


@pytest.mark.parametrize("sign, passes", [(-1.0, True), (1.0, False)])
def test_a_renamed_rewritten_value_grows_its_region_to_shared_values(llama, tmp_path, sign, passes):
    """Neg(x) -> Mul(x, sign) under a new name: the region is the Mul against the Neg, from their shared input."""
    def edit(graph):
        neg = _neg(graph)
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(sign, np.float16), "sign"))
        neg.op_type, neg.input[:] = "Mul", [neg.input[0], "sign"]
        _rename(graph, neg.output[0], "renamed")

    candidate = _rewrite(llama, tmp_path / "mul.onnx", edit)
    if not passes:
        with pytest.raises(VerificationError, match=r"value 'renamed' differs .* region 0 \(Mul in the optimized "
                                                    r"model, 1 node\(s\) of the input model\), compared with "
                                                    r"'/model/layers.0/self_attn/Neg_\d+_output_0'"):
            _verify(llama, candidate)
        return
    verification = _verify(llama, candidate)
    assert verification["passed"] is True and verification["regions"] == 1
    assert verification["region_nodes"] == 1 and verification["original_region_nodes"] == 1
    assert [o["name"] for o in verification["outputs"]] == ["renamed"]


def test_weights_rewritten_everywhere_fall_back_to_the_whole_models(llama, tmp_path, large):
    """x86/fp32 widens every fp16 weight: the one region would read all of them, so both models run whole."""
    verification = _optimize(llama, tmp_path / "out.onnx", "x86/fp32/nchw")
    assert verification["passed"] is True and verification["method"] == "whole model"
    assert verification["regions_refused"].endswith("MiB of weights, more than four pieces of 1 MiB")
    assert verification["summary"].startswith("verified on the whole model, max abs diff ")
