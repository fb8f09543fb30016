"""eliminate_deadend, eliminate_unused_initializer, remove_initializer_from_input."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import body_of, both_conditions, if_model, run


def test_nodes_that_reach_no_output_are_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["dead"], name="neg"),
             helper.make_node("Abs", ["dead"], ["deader"], name="abs")]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])]), ["eliminate_deadend"],
                  tmp_path)
    assert outcome.ops == ["Relu"]
    assert outcome.details("eliminate_deadend") == [{"rule": "eliminate_deadend", "from": ["abs", "neg"], "to": []}]


def test_dead_nodes_in_a_body_are_removed(tmp_path):
    then_nodes = [helper.make_node("Neg", ["x"], ["unused"]), helper.make_node("Relu", ["x"], ["t"])]
    outcome = both_conditions(if_model(then_nodes, "t", [helper.make_node("Neg", ["x"], ["e"])], "e"),
                              ["eliminate_deadend"], tmp_path)
    assert [n.op_type for n in body_of(outcome)] == ["Relu"]


def test_unused_initializers_go_and_overridable_ones_stay(tmp_path):
    nodes = [helper.make_node("Add", ["x", "used"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2]), vinfo("fed", shape=[2])], [vinfo("y", shape=[2])],
                       [tensor("used", np.ones(2, np.float32)), tensor("unused", np.ones(2, np.float32)),
                        tensor("fed", np.ones(2, np.float32))])
    outcome = run(model, ["eliminate_unused_initializer"], tmp_path)
    assert sorted(outcome.model.graph.initializers) == ["fed", "used"]
    assert outcome.entries["eliminate_unused_initializer"][0]["initializers_removed"] == ["unused"]


def test_initializer_inputs_become_constants_and_the_ir_version_rises(tmp_path):
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2]), vinfo("w", shape=[2])], [vinfo("y", shape=[2])],
                       [tensor("w", np.ones(2, np.float32))])
    model.ir_version = 3
    outcome = run(model, ["remove_initializer_from_input"], tmp_path)
    saved = outcome.saved()
    assert saved.ir_version == 4 and [i.name for i in saved.graph.input] == ["x"]
    assert outcome.model.graph.initializers["w"].is_constant
    entry = outcome.entries["remove_initializer_from_input"][0]
    assert entry["inputs_removed"] == ["w"] and entry["ir_version"] == {"from": 3, "to": 4}


def test_a_model_without_initializer_inputs_keeps_its_ir_version(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", shape=[2])], [vinfo("y", shape=[2])])
    outcome = run(model, ["remove_initializer_from_input"], tmp_path)
    assert outcome.saved().ir_version == model.ir_version and outcome.rewrites("remove_initializer_from_input") == 0
