"""eliminate_duplicate_dim_read: a named dim read off any value is read off the first graph input declaring it."""
import numpy as np
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

make = helper.make_node


def mask_positions():
    """Range(0, sequence) twice, the sequence read off the cast mask and off the embeddings (a dynamic
    TorchScript export's mask construction): y = positions of one + positions of the other."""
    nodes = [make("Cast", ["mask"], ["flags"], to=TensorProto.BOOL), make("Shape", ["flags"], ["mask_shape"]),
             make("Gather", ["mask_shape", "one"], ["mask_length"], axis=0),
             make("Gather", ["table", "ids"], ["embedded"]), make("Shape", ["embedded"], ["embedded_shape"]),
             make("Gather", ["embedded_shape", "one"], ["length"], axis=0),
             make("Range", ["zero", "mask_length", "one"], ["mask_positions"]),
             make("Range", ["zero", "length", "one"], ["positions"]),
             make("Add", ["mask_positions", "positions"], ["y"])]
    inputs = [vinfo("ids", TensorProto.INT64, ["batch", "sequence"]),
              vinfo("mask", TensorProto.INT64, ["batch", "sequence"])]
    return make_model(nodes, inputs, [vinfo("y", TensorProto.INT64, ["sequence"])],
                      [tensor("one", np.int64(1)), tensor("zero", np.int64(0)),
                       tensor("table", np.ones((10, 4), np.float32))])


def feeds():
    return {"ids": np.array([[1, 2, 3], [4, 5, 6]], np.int64), "mask": np.ones((2, 3), np.int64)}


def test_reads_of_a_named_dim_become_reads_of_the_first_input_declaring_it(tmp_path):
    outcome = run(mask_positions(), ["eliminate_duplicate_dim_read"], tmp_path, feeds=feeds())
    assert outcome.rewrites("eliminate_duplicate_dim_read") == 2
    shapes = outcome.model.graph.nodes_of_type("Shape")
    assert [n.input(0).name for n in shapes] == ["ids", "ids"]


def test_the_reads_then_merge_with_what_they_feed(tmp_path):
    steps = ["eliminate_duplicate_dim_read", "eliminate_duplicate_initializer", "eliminate_common_subexpression",
             "eliminate_deadend"]
    outcome = run(mask_positions(), steps, tmp_path, feeds=feeds())
    assert sorted(outcome.ops) == ["Add", "Gather", "Range", "Shape"]


def test_a_dim_only_onnx_names_is_left_alone(tmp_path):
    model = mask_positions()
    for value in model.graph.input:
        value.type.tensor_type.shape.dim[1].dim_param = "unk__3"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "unk__3"
    outcome = run(model, ["eliminate_duplicate_dim_read"], tmp_path, feeds=feeds())
    assert outcome.rewrites("eliminate_duplicate_dim_read") == 0
