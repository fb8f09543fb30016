"""gemm_bn_fuse: BatchNormalization after Gemm / 2-D MatMul folds into B and C; refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import floats, optimize
from tests.engine.passes.fuse.test_conv_bn import bn_node, bn_tensors

PASS = "gemm_bn_fuse"


@pytest.mark.parametrize("trans_b,with_c,opset", [(0, True, 13), (1, False, 13), (1, True, 9)])
def test_gemm_and_batchnorm_become_one_gemm(tmp_path, trans_b, with_c, opset):
    inputs = ["x", "w"] + (["c"] if with_c else [])
    nodes = [helper.make_node("Gemm", inputs, ["g"], name="g", transB=trans_b, alpha=0.7, beta=1.5), bn_node("g", "y")]
    inits = [tensor("w", floats(6, 4) if trans_b else floats(4, 6)), *bn_tensors(6)]
    if with_c or opset < 11:
        if not with_c:
            nodes[0].input.append("c")
        inits.append(tensor("c", floats(6, seed=5)))
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4])], ["y"], inits, opset=opset)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm"] and out.node("Gemm").output().name == "y"


def test_matmul_and_batchnorm_become_gemm(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["g"], name="mm"), bn_node("g", "y")]
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4])], ["y"], [tensor("w", floats(4, 6)), *bn_tensors(6)])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm"]


def test_refusals(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="g"), bn_node("g", "y")]
    stats = bn_tensors(6)
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4]), vinfo("bn_var", shape=[6])], ["y"],
                           [tensor("w", floats(4, 6)), *stats[:3]])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm", "BatchNormalization"] and out.refused("(input_var) are not constants")
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4]), vinfo("w", shape=[4, 6])], ["y"], stats)
    out = optimize(tmp_path, model, [PASS])
    assert out.refused("the weights of Gemm 'g' ('w') are not constants")


def test_double_weights_stay_double(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="g"), bn_node("g", "y")]
    stats = [tensor(t.name, numpy_helper.to_array(t).astype(np.float64)) for t in bn_tensors(6)]
    model = inferred_model(nodes, [vinfo("x", TensorProto.DOUBLE, [3, 4])], ["y"],
                           [tensor("w", floats(4, 6).astype(np.float64)), *stats])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm"]
    assert out.node("Gemm").input(1).constant_value().dtype == np.float64
