"""fp16 storage's fallback: a model whose output does not verify with every weight stored in fp16 comes back
verified with the fewest weights kept in fp32, each with the reason; without the fallback it fails as before."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, save_proto, tensor, vinfo
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.errors import VerificationError
from worker.engine.ir import load_model
from worker.engine.numeric import FP16_ATOL, FP16_RTOL, verify

RNG = np.random.default_rng(5)


def cancelling(sensitive: int):
    """y = x @ A + sum_i (x @ B_i - x @ C): A small (fp16 holds it well enough), each B_i 1000 plus noise that
    fp16's spacing there (0.5) rounds away, C 1000 exactly (fp16 holds it). The differences are the noise's
    products: every B_i in fp16 ruins the output, A and C do not."""
    nodes = [helper.make_node("MatMul", ["x", "A"], ["a"]), helper.make_node("MatMul", ["x", "C"], ["c"])]
    weights = [tensor("A", RNG.normal(0, 0.01, (16, 16)).astype(np.float32)),
               tensor("C", np.full((16, 16), 1000, np.float32))]
    last = "a"
    for i in range(sensitive):
        nodes += [helper.make_node("MatMul", ["x", f"B{i}"], [f"b{i}"]),
                  helper.make_node("Sub", [f"b{i}", "c"], [f"d{i}"]),
                  helper.make_node("Add", [last, f"d{i}"], [f"s{i}"])]
        weights.append(tensor(f"B{i}", (1000 + RNG.normal(0, 0.01, (16, 16))).astype(np.float32)))
        last = f"s{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    return make_model(nodes, [vinfo("x", shape=[1, 16])], [vinfo("y", shape=[1, 16])], weights)


@pytest.mark.parametrize("sensitive", [1, 2])
def test_the_weights_fp16_cannot_hold_stay_fp32_and_the_output_verifies(tmp_path, sensitive):
    source = save_proto(cancelling(sensitive), tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(fp16_storage=True))
    assert report["verification"]["passed"] is True
    fallback = report["storage_fallback"]
    assert "does not compute what the input computed" in fallback["failure"]
    kept = {w["weight"] for w in fallback["weights"]}
    assert kept == {f"B{i}" for i in range(sensitive)} and all(w["why"] for w in fallback["weights"])
    assert fallback["ranked"] == 2 + sensitive and fallback["runs"] == len(fallback["steps"])
    # in the file: the kept weights in fp32, the others in fp16 (half the bytes)
    written = load_model(tmp_path / "out.onnx")
    dtypes = {v.name: v.dtype for v in written.graph.initializers.values()}
    assert all(dtypes[name] == TensorProto.FLOAT for name in kept)
    assert dtypes["A_fp16"] == dtypes["C_fp16"] == TensorProto.FLOAT16
    verify(str(source), str(tmp_path / "out.onnx"), rtol=FP16_RTOL, atol=FP16_ATOL)
    assert report["summary"]["storage_fallback"]["weights"] == sorted(kept)


def test_without_the_fallback_fp16_storage_fails_as_it_did(tmp_path):
    source = save_proto(cancelling(1), tmp_path / "in.onnx")
    with pytest.raises(VerificationError, match="does not compute what the input computed"):
        optimize(source, tmp_path / "out.onnx", OptimizeOptions(fp16_storage=True, precision_fallback=False))
    assert not (tmp_path / "out.onnx").exists()


def test_a_model_fp16_storage_does_not_hurt_has_no_fallback(tmp_path):
    model = make_model([helper.make_node("MatMul", ["x", "A"], ["y"])], [vinfo("x", shape=[1, 16])],
                       [vinfo("y", shape=[1, 16])], [tensor("A", RNG.normal(0, 1, (16, 16)).astype(np.float32))])
    report = optimize(save_proto(model, tmp_path / "in.onnx"), tmp_path / "out.onnx",
                      OptimizeOptions(fp16_storage=True))
    assert "storage_fallback" not in report and report["summary"]["storage_fallback"] is None
    assert {v.dtype for v in load_model(tmp_path / "out.onnx").graph.initializers.values()} == {TensorProto.FLOAT16}
