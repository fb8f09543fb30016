"""eliminate_nop_cast: Cast/CastLike to the type the input has goes; real conversions stay."""
import numpy as np
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_cast"]


def test_cast_to_the_same_type_is_removed_and_a_real_cast_stays(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["b"], ["c"], to=TensorProto.INT64),
             helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT)]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Cast", "Cast"]
    assert outcome.refusals("eliminate_nop_cast") == {}


def test_castlike_to_the_same_type_is_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("CastLike", ["a", "like"], ["b"]),
             helper.make_node("Neg", ["b"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])],
                       [tensor("like", np.zeros(1, np.float32))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_cast_of_a_graph_input_to_a_graph_output_is_refused(tmp_path):
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])]), STEP, tmp_path)
    assert outcome.ops == ["Cast"]
    assert outcome.refused("eliminate_nop_cast", "graph output")
