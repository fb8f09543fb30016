"""eliminate_identity: removed; a graph output keeps its name; refused when both ends are graph ends."""
from onnx import helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import body_of, both_conditions, if_model, run

STEP = ["eliminate_identity"]


def test_identity_between_nodes_is_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["b"], name="id"),
             helper.make_node("Neg", ["b"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]
    assert outcome.details("eliminate_identity") == [{"rule": "eliminate_identity", "from": ["id"], "to": []}]
    assert outcome.model.graph.nodes_of_type("Neg")[0].input(0).name == "a"


def test_identity_producing_a_graph_output_hands_the_name_to_its_producer(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Relu"]
    assert [o.name for o in outcome.saved().graph.output] == ["y"]
    assert outcome.model.graph.nodes_of_type("Relu")[0].output().name == "y"


def test_identity_from_a_graph_input_to_a_graph_output_is_refused(tmp_path):
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path)
    assert outcome.ops == ["Identity"]
    assert outcome.refused("eliminate_identity", "'y' is a graph output")


def test_identity_inside_an_if_body_is_removed(tmp_path):
    then_nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["t"])]
    proto = if_model(then_nodes, "t", [helper.make_node("Neg", ["x"], ["e"])], "e")
    outcome = both_conditions(proto, STEP, tmp_path)
    assert [n.op_type for n in body_of(outcome)] == ["Relu"]
    assert body_of(outcome).outputs[0].name == "t"
