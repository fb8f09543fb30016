"""Every edit primitive keeps uses, producers, the op-type index, names and order exact."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import LIGHT, make_model, run_onnxruntime, tensor, vinfo
from worker.engine.errors import ModelError
from worker.engine.ir import Graph, Node, Value, load_model, save_model
from worker.engine.ir.value import Use
from worker.engine.ir.verify import verify_graph


def chain(tmp_path, opset=17):
    """x -> Relu(a) -> Neg(b) -> Abs(c) -> y, with w an unused initializer."""
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                        helper.make_node("Neg", ["a"], ["b"], name="neg"),
                        helper.make_node("Abs", ["b"], ["y"], name="abs")],
                       [vinfo("x", shape=[4])], [vinfo("y", shape=[4])], [tensor("w", np.ones(4, np.float32))],
                       opset=opset)
    path = tmp_path / "chain.onnx"
    onnx.save(model, str(path))
    return load_model(path)


def test_replace_all_uses_moves_every_use(tmp_path):
    model = chain(tmp_path)
    graph = model.graph
    a, x = graph.value("a"), graph.value("x")
    neg = graph.nodes_of_type("Neg")[0]
    graph.replace_all_uses(a, x)
    assert neg.input(0) is x and a.uses == [] and Use(neg, 0) in x.uses
    graph.remove_node(a.producer)
    verify_graph(graph)


def if_graph(tmp_path) -> Graph:
    """x0 -> Relu -> x; If(c) whose two branches compute Neg(x) from the outer scope."""
    then_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [vinfo("t", shape=[4])])
    model = make_model([helper.make_node("Relu", ["x0"], ["x"]),
                        helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=then_graph)],
                       [vinfo("c", TensorProto.BOOL, []), vinfo("x0", shape=[4])], [vinfo("y", shape=[4])])
    onnx.save(model, str(tmp_path / "m.onnx"))
    return load_model(tmp_path / "m.onnx").graph


def test_replace_all_uses_reaches_nested_bodies(tmp_path):
    graph = if_graph(tmp_path)
    x, x0 = graph.value("x"), graph.value("x0")
    assert len(x.uses) == 2 and all(u.node.graph is not graph for u in x.uses)
    graph.replace_all_uses(x, x0)
    graph.remove_node(x.producer)
    verify_graph(graph)
    assert len(x0.uses) == 2


def test_bypass_keeps_the_graph_output_name(tmp_path):
    model = chain(tmp_path)
    graph = model.graph
    y, b = graph.value("y"), graph.value("b")
    abs_node = y.producer
    assert graph.bypass(y, b)
    graph.remove_node(abs_node)
    verify_graph(graph)
    assert [v.name for v in graph.outputs] == ["y"] and graph.outputs[0].producer.op_type == "Neg"
    out = tmp_path / "out.onnx"
    save_model(model, out)
    x = np.array([-1, 2, -3, 4], np.float32)
    np.testing.assert_array_equal(run_onnxruntime(out, {"x": x})[0], -np.maximum(x, 0))


def test_bypass_refuses_to_rename_a_graph_input(tmp_path):
    model = chain(tmp_path)
    graph = model.graph
    assert not graph.bypass(graph.value("y"), graph.value("x"))
    assert graph.outputs[0].name == "y" and graph.value("y").producer.op_type == "Abs"


def test_bypass_gives_the_new_value_what_the_old_ones_type_knew(tmp_path):
    """The two are one tensor: a dim the old value knew (a number, a model's name) replaces one onnx made up
    or left unknown in the new value's type; what the new value knew itself stays; a graph input keeps its
    declared type."""
    graph = chain(tmp_path).graph
    a, b = graph.value("a"), graph.value("b")
    a.shape, b.shape = ("unk__3", None, 4, "n"), ("batch", 7, "unk__9", "m")
    assert graph.bypass(b, a)
    assert a.shape == ("batch", 7, 4, "n")
    graph = chain(tmp_path).graph
    x, a = graph.value("x"), graph.value("a")
    x.shape, a.shape = ("unk__1",), ("batch",)
    assert graph.bypass(a, x)
    assert x.shape == ("unk__1",)


def test_insert_before_and_after_keep_order_and_index(tmp_path):
    graph = chain(tmp_path).graph
    neg = graph.nodes_of_type("Neg")[0]
    a = graph.value("a")
    identity = graph.add_node("Identity", [a], before=neg)
    neg.set_input(0, identity.output())
    sigmoid = graph.add_node("Sigmoid", [identity.output()], after=identity)
    assert [n.op_type for n in graph] == ["Relu", "Identity", "Sigmoid", "Neg", "Abs"]
    assert identity.position < sigmoid.position < neg.position
    assert graph.nodes_of_type("Identity") == [identity]
    graph.remove_node(sigmoid)
    assert graph.nodes_of_type("Sigmoid") == []
    verify_graph(graph)


def test_many_inserts_at_one_place_renumber_correctly(tmp_path):
    graph = chain(tmp_path).graph
    neg = graph.nodes_of_type("Neg")[0]
    for _ in range(40):  # exhausts the gap between two order keys
        graph.add_node("Identity", [graph.value("a")], before=neg)
    positions = [n.position for n in graph]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    verify_graph(graph)


def test_remove_refuses_a_node_whose_output_is_still_used(tmp_path):
    graph = chain(tmp_path).graph
    with pytest.raises(ValueError, match="still used by"):
        graph.remove_node(graph.nodes_of_type("Relu")[0])
    with pytest.raises(ValueError, match="graph output"):
        graph.remove_node(graph.nodes_of_type("Abs")[0])


def test_batch_removal_of_a_connected_chain(tmp_path):
    graph = chain(tmp_path).graph
    relu, neg = graph.nodes_of_type("Relu")[0], graph.nodes_of_type("Neg")[0]
    abs_node = graph.nodes_of_type("Abs")[0]
    abs_node.set_input(0, graph.value("x"))
    graph.remove_nodes([neg, relu])  # order within the batch does not matter
    assert [n.op_type for n in graph] == ["Abs"] and graph.value("a") is None
    verify_graph(graph)


def test_toposort_repairs_order_and_reports_cycles(tmp_path):
    graph = chain(tmp_path).graph
    late = graph.add_node("Neg", [graph.value("x")])  # appended at the end
    graph.nodes_of_type("Relu")[0].set_input(0, late.output())
    assert not graph.is_sorted()
    assert graph.toposort()
    assert [n.op_type for n in graph][:2] == ["Neg", "Relu"]
    verify_graph(graph)
    late.set_input(0, graph.value("b"))  # b depends on late's output: a cycle
    with pytest.raises(ModelError, match="cycle"):
        graph.toposort()


def test_fresh_names_are_unique_across_the_model(tmp_path):
    graph = chain(tmp_path).graph
    names = {graph.make_value("a").name for _ in range(5)}
    assert len(names) == 5 and "a" not in names
    node = graph.add_node("Relu", [graph.value("x")], name="relu")
    assert node.name != "relu"


def test_a_fused_node_takes_over_the_output_value(tmp_path):
    graph = chain(tmp_path).graph
    b = graph.value("b")
    neg, relu = b.producer, graph.nodes_of_type("Relu")[0]
    uses_before = list(b.uses)
    fused = graph.add_node("Neg", [graph.value("x")], outputs=[b], before=neg)
    assert b.producer is fused and b.uses == uses_before and b.name == "b"
    graph.remove_nodes([neg, relu])
    verify_graph(graph)


def test_initializers_add_and_remove(tmp_path):
    graph = chain(tmp_path).graph
    w = graph.initializers["w"]
    with pytest.raises(ValueError):
        w.const[0] = 5  # loaded and set weights are read-only: passes build new arrays
    new = graph.add_initializer("w", np.zeros(3, np.float32))
    assert new.name != "w" and new.is_constant and new.shape == (3,)
    graph.remove_initializer(w)
    assert "w" not in graph.initializers and graph.value("w") is None
    verify_graph(graph)


def test_edits_on_a_real_model_stay_consistent():
    model = load_model(LIGHT / "light_resnet50.onnx")
    graph = model.graph
    relus = graph.nodes_of_type("Relu")
    for relu in relus[:10]:
        graph.replace_all_uses(relu.output(), relu.input(0))
    graph.remove_nodes(relus[:10])
    assert len(graph.nodes_of_type("Relu")) == len(relus) - 10
    verify_graph(graph)


def test_value_kind_predicates():
    graph = Graph("g")
    x = graph.add_input(Value("x", TensorProto.FLOAT, (1, 3)))
    c = graph.add_initializer("c", np.ones(3, np.float32))
    node = graph.append(Node("Add", [x, c], [Value("y")]))
    graph.set_outputs([node.output()])
    assert x.is_graph_input and not x.is_constant
    assert c.is_constant and c.constant_value() is not None
    assert node.output().is_graph_output and not node.output().has_single_consumer()


def test_numel_does_not_overflow():
    assert Value("v", TensorProto.FLOAT, (2**33, 2**33)).numel() == 2**66
    assert Value("s", TensorProto.FLOAT, ()).numel() == 1


def test_renaming_an_initializer_keeps_it_an_initializer(tmp_path):
    graph = chain(tmp_path).graph
    w = graph.initializers["w"]
    graph.rename_value(w, "weights")
    assert graph.initializers["weights"] is w and "w" not in graph.initializers and graph.value("weights") is w
    verify_graph(graph)


def test_every_walk_finds_the_bodies_however_they_were_attached(tmp_path):
    """all_graphs walks only the nodes recorded as holding bodies: loading, set_attr, remove_attr and node
    removal keep that record, and verify_graph catches one that is stale."""
    from worker.engine.ir.verify import IRError
    from worker.engine.ir.node import Attr

    graph = if_graph(tmp_path)
    assert len(list(graph.all_graphs())) == 3  # loaded: the If's two branches
    relu = graph.nodes_of_type("Relu")[0]
    body = Graph("extra")
    relu.set_attr("body", body)  # a body attached after the node joined the graph
    assert body in list(graph.all_graphs())
    verify_graph(graph)
    relu.remove_attr("body")
    assert body not in list(graph.all_graphs())
    relu.attributes["body"] = Attr("body", onnx.AttributeProto.GRAPH, body)  # behind the graph's back
    with pytest.raises(IRError, match="holding bodies"):
        verify_graph(graph)


def test_remove_unused_takes_what_a_removal_freed_and_nothing_else(tmp_path):
    """Unused values go with their producers, then those producers' inputs; a value still read stays."""
    graph = chain(tmp_path).graph
    relu = graph.nodes_of_type("Relu")[0]
    side = graph.add_node("Sigmoid", [graph.value("a")], name="side")  # a second reader of a
    abs_node = graph.nodes_of_type("Abs")[0]
    abs_node.set_input(0, graph.value("x"))  # b (Neg) is read by nobody now
    assert graph.remove_unused([graph.value("b"), graph.initializers["w"]]) == ["neg"]
    assert graph.value("b") is None and "w" not in graph.initializers and relu.graph is graph  # side reads a
    # nobody reads side's output either: it goes, and then the Relu it was the last reader of
    assert graph.remove_unused([side]) == ["side", "relu"]
    assert graph.remove_unused([graph.value("x"), abs_node]) == []  # a graph input, a graph output's node
    assert [n.op_type for n in graph] == ["Abs"]
    verify_graph(graph)


def test_remove_unused_follows_uses_out_of_a_removed_body(tmp_path):
    """A removed If was the last reader of an outer value through its branches: that value's producer goes."""
    graph = if_graph(tmp_path)
    if_node = graph.nodes_of_type("If")[0]
    graph.replace_output(0, graph.value("x"))  # the If's result is read by nobody now
    removed = graph.remove_unused([if_node])
    assert removed[0] == if_node.name and graph.nodes_of_type("If") == []
    assert [n.op_type for n in graph] == ["Relu"]  # x is a graph output now, so its Relu stays
    verify_graph(graph)


def test_live_graphs_skips_a_body_whose_holder_a_pass_removed(tmp_path):
    graph = if_graph(tmp_path)
    if_node = graph.nodes_of_type("If")[0]
    branches = [if_node.attr("then_branch"), if_node.attr("else_branch")]
    seen = []
    for body in graph.live_graphs():
        seen.append(body)
        if body is graph:  # the first graph visited removes the If
            graph.replace_output(0, graph.value("x"))
            graph.remove_unused([if_node])
    assert seen == [graph]
    assert all(not b.is_within(graph) for b in branches) and graph.is_within(graph)


def test_move_before_keeps_name_inputs_and_uses(tmp_path):
    """The then-branch's Neg moves out of the body in front of the If, as inlining an If does."""
    graph = if_graph(tmp_path)
    if_node = graph.nodes_of_type("If")[0]
    body = if_node.attr("then_branch")
    neg = body.nodes_of_type("Neg")[0]
    t, x = neg.output(), graph.value("x")
    body.set_outputs([])
    graph.move_before(neg, if_node)
    assert neg.graph is graph and graph.value("t") is t and body.value("t") is None
    assert neg.input(0) is x and [n.op_type for n in graph] == ["Relu", "Neg", "If"]
    assert graph.nodes_of_type("Neg") == [neg] and body.nodes_of_type("Neg") == []
    graph.replace_all_uses(graph.value("y"), t)
    graph.replace_output(0, t)
    graph.remove_unused([if_node])
    verify_graph(graph)


def test_bypass_refusal_says_why_bypass_would_change_nothing(tmp_path):
    graph = chain(tmp_path).graph
    y, x, b = graph.value("y"), graph.value("x"), graph.value("b")
    assert "'x' is not produced by a node of the same graph" in graph.bypass_refusal(y, x)
    assert graph.bypass_refusal(y, b) is None and graph.bypass_refusal(b, x) is None
