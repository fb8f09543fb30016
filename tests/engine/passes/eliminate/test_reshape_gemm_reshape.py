"""fuse_reshape_gemm_reshape: a Gemm over rows merged from the leading axes and split back is a MatMul + Add."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import compare, run

STEP = ["fuse_reshape_gemm_reshape"]
RULE = "fuse_reshape_gemm_reshape"
make = helper.make_node
RNG = np.random.default_rng(4)


def conv1d(in_shape=(2, 5, 8), merge=(-1, 8), split=(2, 5, 6), trans_b=0, bias_shape=(6,), alpha=1.0,
           allowzero=0):
    """GPT-2's Conv1D with static shapes: x -> Reshape(merge) -> Gemm(B, C) -> Reshape(split) -> y; no bias
    with ``bias_shape`` None, allowzero on both Reshapes as dynamo writes them."""
    b = RNG.normal(size=(6, 8) if trans_b else (8, 6)).astype(np.float32)
    nodes = [make("Reshape", ["x", "merge"], ["rows"], allowzero=allowzero),
             make("Gemm", ["rows", "b", "c"] if bias_shape else ["rows", "b"], ["product"], transB=trans_b,
                  alpha=alpha),
             make("Reshape", ["product", "split"], ["y"], allowzero=allowzero)]
    bias = [tensor("c", RNG.normal(size=bias_shape).astype(np.float32))] if bias_shape else []
    return make_model(nodes, [vinfo("x", shape=list(in_shape))], [vinfo("y", shape=[None, None, None])],
                      [tensor("merge", np.array(merge, np.int64)), tensor("split", np.array(split, np.int64)),
                       tensor("b", b), *bias], opset=14)


def dynamic_conv1d(dynamo=False):
    """The same with a dynamic batch and sequence, as TorchScript writes it: the second shape is x's leading dims
    read off x (Shape, Gather, Unsqueeze, Concat) and N; as dynamo writes it, by Shape(x, start=i, end=i + 1)."""
    if dynamo:
        nodes = [make("Shape", ["x"], ["n1"], start=0, end=1), make("Shape", ["x"], ["s1"], start=1, end=2)]
    else:
        nodes = [make("Shape", ["x"], ["shape"]),
                 make("Gather", ["shape", "zero"], ["n"], axis=0), make("Gather", ["shape", "one"], ["s"], axis=0),
                 make("Unsqueeze", ["n", "axes"], ["n1"]), make("Unsqueeze", ["s", "axes"], ["s1"])]
    nodes += [make("Concat", ["n1", "s1", "width"], ["split"], axis=0),
             make("Reshape", ["x", "merge"], ["rows"]), make("Gemm", ["rows", "b", "c"], ["product"]),
             make("Reshape", ["product", "split"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=["batch", "sequence", 8])], [vinfo("y", shape=[None, None, None])],
                      [tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
                       tensor("axes", np.array([0], np.int64)), tensor("width", np.array([6], np.int64)),
                       tensor("merge", np.array([-1, 8], np.int64)),
                       tensor("b", RNG.normal(size=(8, 6)).astype(np.float32)),
                       tensor("c", RNG.normal(size=(6,)).astype(np.float32))])


def feeds(shape):
    return {"x": RNG.normal(size=shape).astype(np.float32)}


@pytest.mark.parametrize("trans_b, bias_shape, merge, allowzero", [(0, (6,), (-1, 8), 0), (1, (1, 6), (10, 8), 0),
                                                                   (0, None, (-1, 8), 1)])
def test_a_gemm_over_merged_rows_is_a_matmul_and_an_add(tmp_path, trans_b, bias_shape, merge, allowzero):
    outcome = run(conv1d(trans_b=trans_b, bias_shape=bias_shape, merge=merge, allowzero=allowzero), STEP, tmp_path,
                  feeds=feeds((2, 5, 8)))
    assert outcome.ops == (["MatMul", "Add"] if bias_shape else ["MatMul"])
    matmul = outcome.model.graph.nodes_of_type("MatMul")[0]
    assert matmul.input(0).name == "x" and matmul.input(1).shape == (8, 6)
    assert outcome.model.graph.outputs[0].shape == (2, 5, 6)


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_dynamic_batch_and_sequence_lose_the_shape_computation_too(tmp_path, dynamo):
    outcome = run(dynamic_conv1d(dynamo), STEP, tmp_path)
    assert outcome.ops == ["MatMul", "Add"]
    for shape in ((1, 3, 8), (2, 5, 8)):
        compare(outcome.before, outcome.after, feeds=feeds(shape))


@pytest.mark.parametrize("model, refusal", [
    (conv1d(split=(5, 2, 6)), "does not split the rows into the input's leading dims"),
    (conv1d(merge=(10, 8), in_shape=(2, 10, 4), split=(2, 5, 6)), "does not merge the leading axes alone"),
    (conv1d(alpha=0.5), "scales or transposes"),
])
def test_a_gemm_whose_rows_come_back_otherwise_stays(tmp_path, model, refusal):
    outcome = run(model, STEP, tmp_path, check=False)
    assert outcome.ops == ["Reshape", "Gemm", "Reshape"]
    assert outcome.refused(RULE, refusal)
