"""eliminate_full_gather: a Gather / GatherND taking every element of its data in order is a Reshape."""
import numpy as np
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_full_gather"]
make = helper.make_node


def gather_model(op, data_shape, indices, out_shape, dtype=TensorProto.FLOAT, **attributes):
    nodes = [make(op, ["data", "indices"], ["y"], **attributes)]
    return make_model(nodes, [vinfo("data", dtype, list(data_shape))], [vinfo("y", dtype, list(out_shape))],
                      [tensor("indices", np.asarray(indices, np.int64))], opset=17)


def feeds(shape, dtype=np.float32):
    return {"data": np.random.default_rng(6).normal(size=shape).astype(dtype)}


def test_the_padding_mask_indexed_by_batch_and_position_aranges_is_a_reshape(tmp_path):
    # mask[batch_idx, kv_idx] at batch 1, sequence 16, as dynamo writes it
    positions = np.stack([np.zeros(16, np.int64), np.arange(16)], axis=-1).reshape(1, 1, 1, 16, 2)
    model = gather_model("GatherND", (1, 16), positions, (1, 1, 1, 16), dtype=TensorProto.BOOL)
    mask = {"data": np.random.default_rng(1).integers(0, 2, (1, 16)).astype(bool)}
    outcome = run(model, STEP, tmp_path, feeds=mask, rtol=0, atol=0)
    assert outcome.ops == ["Reshape"]
    assert outcome.model.graph.nodes_of_type("Reshape")[0].input(0).name == "data"


def test_a_gather_of_every_entry_of_an_inner_axis_is_a_reshape(tmp_path):
    model = gather_model("Gather", (2, 6, 3), np.arange(6).reshape(2, 3), (2, 2, 3, 3), axis=1)
    outcome = run(model, STEP, tmp_path, feeds=feeds((2, 6, 3)), rtol=0, atol=0)
    assert outcome.ops == ["Reshape"]


def test_negative_indices_count_from_the_end(tmp_path):
    model = gather_model("Gather", (4, 3), np.arange(4) - 4, (4, 3))
    outcome = run(model, STEP, tmp_path, feeds=feeds((4, 3)), rtol=0, atol=0)
    assert outcome.ops == ["Reshape"]


def test_a_gathernd_of_whole_rows_is_a_reshape(tmp_path):
    rows = np.indices((2, 3)).reshape(2, -1).T  # k = 2 of rank 3: each index takes a row of 4
    model = gather_model("GatherND", (2, 3, 4), rows, (6, 4))
    outcome = run(model, STEP, tmp_path, feeds=feeds((2, 3, 4)), rtol=0, atol=0)
    assert outcome.ops == ["Reshape"]


def test_a_gather_that_skips_or_repeats_an_entry_stays(tmp_path):
    model = gather_model("Gather", (4, 3), [0, 1, 1, 3], (4, 3))
    outcome = run(model, STEP, tmp_path, feeds=feeds((4, 3)))
    assert outcome.ops == ["Gather"]
    assert outcome.refused("eliminate_full_gather", "do not take every entry of the axis in order")


def test_every_position_out_of_order_stays(tmp_path):
    rows = np.indices((2, 3)).reshape(2, -1).T[::-1]
    model = gather_model("GatherND", (2, 3), rows, (6,))
    outcome = run(model, STEP, tmp_path, feeds=feeds((2, 3)))
    assert outcome.ops == ["GatherND"]
    assert outcome.refused("eliminate_full_gather", "do not take every position of the data in order")


def test_a_gathernd_with_batch_dims_stays(tmp_path):
    model = gather_model("GatherND", (2, 3), [[0], [1]], (2,), batch_dims=1)
    outcome = run(model, STEP, tmp_path, feeds=feeds((2, 3)))
    assert outcome.ops == ["GatherND"]
    assert outcome.refused("eliminate_full_gather", "it gathers per batch")


def test_indices_known_only_at_run_time_stay(tmp_path):
    nodes = [make("Gather", ["data", "indices"], ["y"])]
    model = make_model(nodes, [vinfo("data", shape=[4, 3]), vinfo("indices", TensorProto.INT64, [4])],
                       [vinfo("y", shape=[4, 3])])
    outcome = run(model, STEP, tmp_path, feeds={**feeds((4, 3)), "indices": np.arange(4)})
    assert outcome.ops == ["Gather"]
    assert outcome.refused("eliminate_full_gather", "indices are not known offline")
