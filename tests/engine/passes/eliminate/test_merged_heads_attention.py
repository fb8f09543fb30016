"""fuse_merged_heads_attention: attention as bmm over heads merged into the batch is the same attention in 4-D."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_merged_heads_attention"]
make = helper.make_node
B, H, S, T, D = 2, 3, 5, 7, 4


def bmm_attention(split=(B, H, S, D), axis=-1):
    """CLIP / BART-style attention: q, k, v (b, h, seq, d) merged to (b * h, seq, d), bmm, Softmax, bmm, split."""
    nodes = [make("Reshape", ["q", "q_merge"], ["q3"]), make("Reshape", ["k", "kv_merge"], ["k3"]),
             make("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]), make("MatMul", ["q3", "kt3"], ["s3"]),
             make("Softmax", ["s3"], ["w3"], axis=axis), make("Reshape", ["v", "kv_merge"], ["v3"]),
             make("MatMul", ["w3", "v3"], ["y3"]), make("Reshape", ["y3", "split"], ["y"])]
    inputs = [vinfo("q", shape=[B, H, S, D]), vinfo("k", shape=[B, H, T, D]), vinfo("v", shape=[B, H, T, D])]
    return make_model(nodes, inputs, [vinfo("y", shape=list(split))],
                      [tensor("q_merge", np.array([B * H, S, D], np.int64)),
                       tensor("kv_merge", np.array([B * H, T, D], np.int64)),
                       tensor("split", np.array(split, np.int64))])


def broadcast_attention():
    """The dynamo exporter's form at batch 1: a 4-D query times 3-D keys, 3-D weights times 4-D values."""
    nodes = [make("Reshape", ["k", "k_merge"], ["k3"]), make("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
             make("MatMul", ["q", "kt3"], ["s4"]), make("Add", ["s4", "mask"], ["masked"]),
             make("Reshape", ["masked", "s_merge"], ["s3"]), make("Softmax", ["s3"], ["w3"], axis=-1),
             make("MatMul", ["w3", "v"], ["y"])]
    inputs = [vinfo("q", shape=[1, H, S, D]), vinfo("k", shape=[1, H, T, D]), vinfo("v", shape=[1, H, T, D]),
              vinfo("mask", shape=[1, 1, S, T])]
    return make_model(nodes, inputs, [vinfo("y", shape=[1, H, S, D])],
                      [tensor("k_merge", np.array([H, T, D], np.int64)),
                       tensor("s_merge", np.array([H, S, T], np.int64))])


def feeds(**shapes):
    rng = np.random.default_rng(3)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


def test_bmm_attention_over_merged_heads_becomes_4d(tmp_path):
    outcome = run(bmm_attention(), STEP, tmp_path,
                  feeds=feeds(q=(B, H, S, D), k=(B, H, T, D), v=(B, H, T, D)))
    assert outcome.ops == ["Transpose", "MatMul", "Softmax", "MatMul"]
    graph = outcome.model.graph
    assert [n.input(0).name for n in graph.nodes_of_type("MatMul")][0] == "q"
    assert graph.nodes_of_type("MatMul")[1].input(1).name == "v"
    assert list(graph.nodes_of_type("Transpose")[0].attr("perm")) == [0, 1, 3, 2]


def test_the_dynamo_broadcast_form_at_batch_one_becomes_4d(tmp_path):
    outcome = run(broadcast_attention(), STEP, tmp_path,
                  feeds=feeds(q=(1, H, S, D), k=(1, H, T, D), v=(1, H, T, D), mask=(1, 1, S, T)))
    assert outcome.ops == ["Transpose", "MatMul", "Add", "Softmax", "MatMul"]
    assert outcome.model.graph.nodes_of_type("Softmax")[0].input(0).shape == (1, H, S, T)


@pytest.mark.parametrize("model, refusal", [
    (lambda: bmm_attention(axis=1), "does not normalize the last axis alone"),
    (lambda: bmm_attention(split=(H, B, S, D)), "not split back into the scores' batch and heads")])
def test_attention_over_other_axes_or_split_otherwise_keeps_its_bmm(tmp_path, model, refusal):
    outcome = run(model(), STEP, tmp_path, feeds=feeds(q=(B, H, S, D), k=(B, H, T, D), v=(B, H, T, D)))
    assert "Reshape" in outcome.ops
    assert outcome.refused("fuse_merged_heads_attention", refusal)
