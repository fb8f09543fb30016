"""fuse_reshape_transpose_reshape: a Transpose of trailing axes written over merged leading axes is one Transpose."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_reshape_transpose_reshape"]
make = helper.make_node


def merged_transpose(in_shape, merge, perm, split, extra_outputs=()):
    """x -> Reshape(merge) -> Transpose(perm) -> Reshape(split) -> y, as dynamo writes q @ k.transpose(-2, -1)."""
    nodes = [make("Reshape", ["x", "merge"], ["merged"]), make("Transpose", ["merged"], ["moved"], perm=perm),
             make("Reshape", ["moved", "split"], ["y"])]
    out_shape = [d for d in split if d != -1] if -1 not in split else None
    return make_model(nodes, [vinfo("x", shape=list(in_shape))], [vinfo("y", shape=out_shape), *extra_outputs],
                      [tensor("merge", np.array(merge, np.int64)), tensor("split", np.array(split, np.int64))])


def feeds(shape):
    return {"x": np.random.default_rng(2).normal(size=shape).astype(np.float32)}


def test_a_transposed_key_written_as_a_batched_matmul_operand_is_one_transpose(tmp_path):
    model = merged_transpose((1, 6, 17, 8), [-1, 17, 8], [0, 2, 1], [1, 6, 8, 17])
    outcome = run(model, STEP, tmp_path, feeds=feeds((1, 6, 17, 8)), rtol=0, atol=0)
    assert outcome.ops == ["Transpose"]
    transpose = outcome.model.graph.nodes_of_type("Transpose")[0]
    assert transpose.input(0).name == "x" and list(transpose.attr("perm")) == [0, 1, 3, 2]


def test_leading_axes_split_otherwise_are_reshaped_before_the_transpose(tmp_path):
    # the dynamo ViT: a Split of the stacked q, k, v leaves [1, 1, heads, tokens, dim]
    model = merged_transpose((1, 1, 6, 17, 8), [6, 17, 8], [0, 2, 1], [1, 6, 8, 17])
    outcome = run(model, STEP, tmp_path, feeds=feeds((1, 1, 6, 17, 8)), rtol=0, atol=0)
    assert outcome.ops == ["Reshape", "Transpose"]
    assert list(outcome.model.graph.nodes_of_type("Transpose")[0].attr("perm")) == [0, 1, 3, 2]


def test_three_trailing_axes_keep_their_permutation(tmp_path):
    model = merged_transpose((2, 3, 4, 5, 6), [6, 4, 5, 6], [0, 3, 1, 2], [2, 3, 6, 4, 5])
    outcome = run(model, STEP, tmp_path, feeds=feeds((2, 3, 4, 5, 6)), rtol=0, atol=0)
    assert outcome.ops == ["Transpose"]
    assert list(outcome.model.graph.nodes_of_type("Transpose")[0].attr("perm")) == [0, 1, 4, 2, 3]


def test_a_transpose_that_moves_the_merged_axis_is_one_transpose_of_the_atoms(tmp_path):
    """(2, 3, 4, 5) merged to (6, 4, 5), transposed to (4, 6, 5), split to (4, 2, 3, 5): the atoms 2, 3, 4, 5
    move as 4, 2, 3, 5, one Transpose of x."""
    model = merged_transpose((2, 3, 4, 5), [6, 4, 5], [1, 0, 2], [4, 2, 3, 5])
    outcome = run(model, STEP, tmp_path, feeds=feeds((2, 3, 4, 5)), rtol=0, atol=0)
    assert outcome.ops == ["Transpose"]
    assert list(outcome.model.graph.nodes_of_type("Transpose")[0].attr("perm")) == [2, 0, 1, 3]


def multi_head(perm, split, in_shape=(5, "batch", 768)):
    """nn.MultiheadAttention's head split, sequence first, as both exporters write it at a dynamic batch:
    (5, batch, 768) -> Reshape(5, -1, 64) -> Transpose(perm) -> Reshape(split)."""
    nodes = [make("Reshape", ["x", "merge"], ["merged"]), make("Transpose", ["merged"], ["moved"], perm=perm),
             make("Reshape", ["moved", "split"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(in_shape))], [vinfo("y", shape=[None] * len(split))],
                      [tensor("merge", np.array([5, -1, 64], np.int64)), tensor("split", np.array(split, np.int64))])


@pytest.mark.parametrize("perm, split, expected_perm", [([1, 0, 2], [-1, 12, 5, 64], [1, 2, 0, 3]),  # q, v
                                                        ([1, 2, 0], [-1, 12, 64, 5], [1, 2, 3, 0])])  # k, transposed
def test_heads_split_over_a_named_batch_are_a_reshape_and_a_transpose_of_the_atoms(tmp_path, perm, split,
                                                                                     expected_perm):
    outcome = run(multi_head(perm, split), STEP, tmp_path, feeds=feeds((5, 2, 768)), rtol=0, atol=0)
    assert outcome.ops == ["Reshape", "Transpose"]
    graph = outcome.model.graph
    reshape, transpose = graph.nodes_of_type("Reshape")[0], graph.nodes_of_type("Transpose")[0]
    assert reshape.input(0).name == "x" and list(reshape.input(1).constant_value()) == [5, 0, 12, 64]
    assert list(transpose.attr("perm")) == expected_perm and transpose.output(0).name == "y"


@pytest.mark.parametrize("merge, perm, split, refusal", [
    ([6, 2, 10], [0, 2, 1], [2, 3, 10, 2], "as a Transpose of atoms it still takes three nodes"),
    ([6, 4, 5], [0, 2, 1], [2, 3, 4, 5], "the second Reshape splits what the Transpose moved"),
    ([4, 30], [1, 0], [30, 4], "the first Reshape splits a dim of its input across two of its own")])
def test_a_transpose_over_axes_merged_or_split_otherwise_stays(tmp_path, merge, perm, split, refusal):
    outcome = run(merged_transpose((2, 3, 4, 5), merge, perm, split), STEP, tmp_path, feeds=feeds((2, 3, 4, 5)))
    assert outcome.ops == ["Reshape", "Transpose", "Reshape"]
    assert outcome.refused("fuse_reshape_transpose_reshape", refusal)


def test_a_dim_onnx_made_up_is_no_atom(tmp_path):
    """x's second dim is unknown (no name), so nothing says which atoms the -1 holds."""
    outcome = run(multi_head([1, 0, 2], [-1, 12, 5, 64], in_shape=(5, None, 768)), STEP, tmp_path,
                  feeds=feeds((5, 2, 768)))
    assert outcome.ops == ["Reshape", "Transpose", "Reshape"]
    assert outcome.refused("fuse_reshape_transpose_reshape", "is not known as numbers and the model's names")


def test_an_intermediate_read_elsewhere_stays(tmp_path):
    model = merged_transpose((1, 6, 17, 8), [-1, 17, 8], [0, 2, 1], [1, 6, 8, 17],
                             extra_outputs=[vinfo("moved", shape=[6, 8, 17])])
    outcome = run(model, STEP, tmp_path, feeds=feeds((1, 6, 17, 8)))
    assert outcome.ops == ["Reshape", "Transpose", "Reshape"]


def test_an_unsqueeze_transpose_squeeze_that_moves_whole_dims_is_one_transpose(tmp_path):
    """nn.MultiheadAttention's unbind of its packed q, k, v at a dynamic batch (TorchScript writes it so):
    Unsqueeze(0) -> Transpose(3, 1, 2, 0, 4) -> Squeeze(3) moves the unit axis in and out again."""
    nodes = [make("Unsqueeze", ["x", "zero"], ["merged"]),
             make("Transpose", ["merged"], ["moved"], perm=[3, 1, 2, 0, 4]),
             make("Squeeze", ["moved", "three"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[5, "batch", 3, 768])], [vinfo("y", shape=[None] * 4)],
                       [tensor("zero", np.array([0], np.int64)), tensor("three", np.array([3], np.int64))])
    outcome = run(model, STEP, tmp_path, feeds=feeds((5, 2, 3, 768)), rtol=0, atol=0)
    assert outcome.ops == ["Transpose"]
    transpose = outcome.model.graph.nodes_of_type("Transpose")[0]
    assert transpose.input(0).name == "x" and list(transpose.attr("perm")) == [2, 0, 1, 3]
