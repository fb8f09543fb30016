"""fc_fuse: 2-D MatMul + Add -> Gemm; Transposes into transA/transB; Gemm + Add; 3-D MatMul refused."""
from __future__ import annotations

import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "fc_fuse"


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("bias_shape", [[5], [1, 5], [3, 5], [3, 1]])
def test_matmul_add_becomes_gemm(tmp_path, opset, bias_shape):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["bias", "m"], ["y"], name="add")]
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4])], ["y"],
                           [tensor("w", floats(4, 5)), tensor("bias", floats(*bias_shape, seed=2))], opset=opset)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm"] and out.node("Gemm").output().name == "y"


def test_three_d_matmul_is_refused(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Add", ["m", "b"], ["y"])]
    model = inferred_model(nodes, [vinfo("x", shape=[2, 3, 4])], ["y"], [tensor("w", floats(4, 5)),
                                                                       tensor("b", floats(5))])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["MatMul", "Add"]
    assert out.refused("MatMul 'mm' has an input of shape [2, 3, 4], and Gemm takes 2-D inputs only")


def test_add_that_enlarges_the_product_is_refused(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]
    model = inferred_model(nodes, [vinfo("x", shape=[1, 4])], ["y"], [tensor("w", floats(4, 5)),
                                                                    tensor("b", floats(3, 5))])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["MatMul", "Add"] and out.refused("not one Gemm's C takes")


@pytest.mark.parametrize("opset", [9, 13])
def test_transposes_fold_into_gemm_flags(tmp_path, opset):
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["xt", "wt"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]
    model = inferred_model(nodes, [vinfo("x", shape=[4, 3]), vinfo("w", shape=[5, 4])], ["y"],
                           [tensor("b", floats(5))], opset=opset)
    out = optimize(tmp_path, model, [PASS])
    gemm = out.node("Gemm")
    assert out.ops == ["Gemm"] and gemm.attr("transA") == 1 and gemm.attr("transB") == 1


def test_transposed_matmul_without_add(tmp_path):
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4])], ["y"], [tensor("w", floats(5, 4))], opset=9)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm"] and out.node("Gemm").attr("transB") == 1


def test_transpose_that_is_a_graph_output_stays(tmp_path):
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("Gemm", ["x", "wt"], ["y"], name="g")]
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4])], ["y", "wt"], [tensor("w", floats(5, 4))])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Transpose", "Gemm"] and out.rewrites(PASS) == 0


@pytest.mark.parametrize("with_c", [False, True])
def test_gemm_then_add(tmp_path, with_c):
    gemm_inputs = ["x", "w"] + (["c"] if with_c else [])
    nodes = [helper.make_node("Gemm", gemm_inputs, ["g"], name="g", alpha=0.5, beta=2.0, transB=1),
             helper.make_node("Add", ["g", "d"], ["y"], name="add")]
    inits = [tensor("w", floats(5, 4)), tensor("d", floats(1, 5, seed=3))]
    if with_c:
        inits.append(tensor("c", floats(5, seed=4)))
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4])], ["y"], inits)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm"] and out.node("Gemm").attr("beta") == 1.0


def test_gemm_with_a_variable_c_then_add_is_refused(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], name="g"),
             helper.make_node("Add", ["g", "d"], ["y"], name="add")]
    model = inferred_model(nodes, [vinfo("x", shape=[3, 4]), vinfo("c", shape=[5])], ["y"],
                           [tensor("w", floats(4, 5)), tensor("d", floats(5))])
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Gemm", "Add"] and out.refused("already has a C")
