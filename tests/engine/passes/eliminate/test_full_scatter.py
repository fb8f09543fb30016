"""eliminate_full_scatter: a ScatterND writing every position of its data in order is its updates reshaped."""
import numpy as np
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_full_scatter"]
make = helper.make_node


def scatter_model(data_shape, indices, updates_shape, **attributes):
    """data -> Relu -> ScatterND(indices, updates) -> y (the data computed, as an attention's: once it is
    overwritten, nothing reads the Relu and it goes too)."""
    nodes = [make("Relu", ["data"], ["computed"]), make("ScatterND", ["computed", "indices", "updates"], ["y"],
                                                         **attributes)]
    return make_model(nodes, [vinfo("data", shape=list(data_shape)), vinfo("updates", shape=list(updates_shape))],
                      [vinfo("y", shape=list(data_shape))], [tensor("indices", np.asarray(indices, np.int64))],
                      opset=18)


def every_position(shape):
    """The indices TorchScript writes for ``x[:, :, 0:, 0:] = u``: every position, row-major, one per element."""
    return np.stack(np.meshgrid(*[np.arange(d) for d in shape], indexing="ij"), axis=-1)


def feeds(data_shape, updates_shape):
    rng = np.random.default_rng(4)
    return {"data": rng.normal(size=data_shape).astype(np.float32),
            "updates": rng.normal(size=updates_shape).astype(np.float32)}


def test_a_scatter_over_every_element_is_its_updates(tmp_path):
    shape = (1, 2, 6, 4)
    model = scatter_model(shape, every_position(shape), shape)
    outcome = run(model, STEP, tmp_path, feeds=feeds(shape, shape), rtol=0, atol=0)
    assert outcome.ops == ["Reshape"]
    reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
    assert reshape.input(0).name == "updates" and not reshape.input(0).uses[1:]


def test_a_scatter_of_whole_rows_over_every_row_reshapes_the_updates(tmp_path):
    # k = 2 < rank: each index writes a [5] row; the updates come as [6, 5] for data [2, 3, 5]
    indices = every_position((2, 3)).reshape(6, 2)
    model = scatter_model((2, 3, 5), indices, (6, 5))
    outcome = run(model, STEP, tmp_path, feeds=feeds((2, 3, 5), (6, 5)), rtol=0, atol=0)
    assert outcome.ops == ["Reshape"]


def test_negative_indices_count_from_the_end(tmp_path):
    shape = (2, 3)
    indices = every_position(shape) - np.array([2, 3])  # the same positions, written from the end
    model = scatter_model(shape, indices, shape)
    outcome = run(model, STEP, tmp_path, feeds=feeds(shape, shape), rtol=0, atol=0)
    assert outcome.ops == ["Reshape"]


def test_a_scatter_over_part_of_the_data_stays(tmp_path):
    shape = (1, 2, 6, 4)
    indices = every_position((1, 2, 5, 4))  # x[:, :, 0:5] = u: the last row keeps the data
    model = scatter_model(shape, indices, (1, 2, 5, 4))
    outcome = run(model, STEP, tmp_path, feeds=feeds(shape, (1, 2, 5, 4)))
    assert outcome.ops == ["Relu", "ScatterND"]
    assert outcome.refused("eliminate_full_scatter", "do not write every position of the data in order")


def test_every_position_out_of_order_stays(tmp_path):
    shape = (3, 4)
    indices = every_position(shape)[::-1]
    model = scatter_model(shape, indices, shape)
    outcome = run(model, STEP, tmp_path, feeds=feeds(shape, shape))
    assert outcome.ops == ["Relu", "ScatterND"]


def test_a_reducing_scatter_reads_the_data_and_stays(tmp_path):
    shape = (2, 3)
    model = scatter_model(shape, every_position(shape), shape, reduction="add")
    outcome = run(model, STEP, tmp_path, feeds=feeds(shape, shape))
    assert outcome.ops == ["Relu", "ScatterND"]
    assert outcome.refused("eliminate_full_scatter", "it reduces (add) into the data")


def test_indices_known_only_at_run_time_stay(tmp_path):
    nodes = [make("ScatterND", ["data", "indices", "updates"], ["y"])]
    model = make_model(nodes, [vinfo("data", shape=[2, 3]), vinfo("indices", TensorProto.INT64, [2, 3, 2]),
                               vinfo("updates", shape=[2, 3])], [vinfo("y", shape=[2, 3])], opset=18)
    feed = {**feeds((2, 3), (2, 3)), "indices": every_position((2, 3))}
    outcome = run(model, STEP, tmp_path, feeds=feed)
    assert outcome.ops == ["ScatterND"]
    assert outcome.refused("eliminate_full_scatter", "indices are not known offline")
