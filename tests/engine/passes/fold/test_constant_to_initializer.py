"""constant_to_initializer: Constant nodes become initializers of the main graph under their own names."""
import numpy as np
from onnx import TensorProto, helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import body_of, both_conditions, if_model, run

STEP = ["constant_to_initializer"]


def test_constants_become_named_initializers(tmp_path):
    nodes = [helper.make_node("Constant", [], ["k"], value=helper.make_tensor("t", TensorProto.FLOAT, [3], [1, 2, 3])),
             helper.make_node("Constant", [], ["s"], value_float=2.0),
             helper.make_node("Add", ["x", "k"], ["a"]), helper.make_node("Mul", ["a", "s"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Add", "Mul"]
    initializers = outcome.model.graph.initializers
    np.testing.assert_array_equal(initializers["k"].const, [1, 2, 3])
    assert initializers["s"].const.shape == () and outcome.rewrites("constant_to_initializer") == 2


def test_constant_in_an_if_body_moves_to_the_main_graph(tmp_path):
    then_nodes = [helper.make_node("Constant", [], ["k"], value_floats=[1.0, 2.0, 3.0]),
                  helper.make_node("Add", ["x", "k"], ["t"])]
    outcome = both_conditions(if_model(then_nodes, "t", [helper.make_node("Neg", ["x"], ["e"])], "e"), STEP,
                              tmp_path)
    assert [n.op_type for n in body_of(outcome)] == ["Add"]
    assert "k" in outcome.model.graph.initializers


def test_constant_that_is_a_graph_output_is_refused(tmp_path):
    nodes = [helper.make_node("Constant", [], ["y"], value_ints=[1, 2])]
    outcome = run(make_model(nodes, [], [vinfo("y", TensorProto.INT64, [2])]), STEP, tmp_path)
    assert outcome.ops == ["Constant"]
    assert outcome.refused("constant_to_initializer", "is a graph output")
