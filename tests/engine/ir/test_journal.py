"""The edit journal: every kind of edit a pass can make is undone exactly, byte for byte, on real models."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import CORPUS, LIGHT, make_model, vinfo
from worker.engine.ir import Graph, Node, Value, load_model, model_to_proto
from worker.engine.ir.journal import Journal, is_open
from worker.engine.ir.verify import verify_graph
from worker.engine.places import Place


def serialized(model) -> bytes:
    return model_to_proto(model).SerializeToString(deterministic=True)


def uses_of(model) -> dict:
    """Every value's uses and producer by name: the parts the file does not show."""
    found = {}
    for graph in model.graph.all_graphs():
        for value in graph.values():
            found[value.name] = (sorted((u.node.name, u.slot) for u in value.uses),
                                 value.producer.name if value.producer else None, value.place)
    return found


def edit_everything(model) -> None:
    """Edits of every kind the IR offers, the way passes make them."""
    graph = model.graph
    nodes = list(graph)
    first, second, last = nodes[0], nodes[1], nodes[-1]
    # new nodes and values, a fresh name, an initializer, an input rewired
    relu = graph.add_node("Relu", [first.output()], ["edited_relu"], before=second)
    second.set_input(0, relu.output())
    weight = graph.add_initializer("edited_weight", np.ones((3,), np.float32))
    graph.add_node("Identity", [weight], 1)
    # attribute writes on existing objects, as passes do them
    first.op_type, first.name = "Renamed" + first.op_type, first.name
    first.output().shape, first.output().dtype = (7, 7), TensorProto.FLOAT16
    first.output().place = Place.parse("arm/fp16/nhwc")
    first.metadata["mirserve.kernel"] = "edited"
    first.output().metadata["note"] = "edited"
    graph.metadata["note"] = "edited"
    model.metadata["note"] = "edited"
    model.opset_imports["mirserve"] = 1
    first.set_attr("edited", [1, 2, 3])
    for name in list(second.attributes):
        second.remove_attr(name)
    # renames, a graph output taken over, removals and a new order
    graph.rename_fresh(second.output(), "renamed")
    graph.bypass(last.output(), last.input(0)) if last.input(0) is not None and last.input(0).producer else None
    initializer = next(iter(graph.initializers.values()))
    for use in list(initializer.uses):
        use.node.set_input(use.slot, weight)
    graph.remove_unused([initializer])
    graph.move_before(relu, first)
    graph.toposort()


@pytest.mark.models
@pytest.mark.parametrize("path", [LIGHT / "light_squeezenet.onnx", CORPUS / "ch_PP-OCRv4_det_infer.onnx",
                                  CORPUS / "bert_small_dyn.onnx"], ids=lambda p: p.stem)
def test_rollback_restores_a_real_model_byte_for_byte(path):
    model = load_model(path)
    before, links = serialized(model), uses_of(model)
    journal = Journal(model)
    with journal:
        edit_everything(model)
    assert serialized(model) != before and journal.changed > 0
    journal.rollback()
    assert serialized(model) == before
    assert uses_of(model) == links
    verify_graph(model.graph)
    # fresh names continue as if the undone pass had never asked for any
    assert model.graph.make_value("edited_relu").name == "edited_relu"


def if_model():
    then_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [vinfo("t", shape=[2])])
    else_branch = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [vinfo("e", shape=[2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Relu", ["y"], ["z"])]
    return make_model(nodes, [vinfo("c", TensorProto.BOOL, []), vinfo("x", shape=[2])], [vinfo("z", shape=[2])])


def test_edits_inside_bodies_are_undone(tmp_path):
    from onnx import save

    save(if_model(), str(tmp_path / "if.onnx"))
    model = load_model(tmp_path / "if.onnx")
    before = serialized(model)
    body = next(b for b in model.graph.nodes_of_type("If")[0].subgraphs() if b.nodes_of_type("Neg"))
    journal = Journal(model)
    with journal:
        neg = body.nodes_of_type("Neg")[0]
        neg.op_type = "Abs"
        body.add_node("Sigmoid", [neg.output()], 1)
        model.graph.nodes_of_type("If")[0].set_attr("then_branch", Graph("replaced", names=model.graph.names))
    journal.rollback()
    assert serialized(model) == before
    verify_graph(model.graph)


def test_objects_made_in_the_journal_are_not_saved_and_hooks_go_with_it():
    graph = Graph("g")
    x = graph.add_input(Value("x", TensorProto.FLOAT, (2,)))
    journal = Journal()
    with journal:
        assert is_open() and "__setattr__" in Node.__dict__
        made = graph.add_node("Relu", [x], 1)
        made.op_type, made.output().shape = "Sigmoid", (3,)
        saved = journal.changed  # the graph, the names and x (a new use): not the new node and value
    assert not is_open() and "__setattr__" not in Node.__dict__ and "__setattr__" not in Value.__dict__
    assert saved == 3
    journal.rollback()
    assert len(graph) == 0 and x.uses == [] and graph.value("relu_out0") is None


def test_a_journal_that_is_not_rolled_back_keeps_every_edit():
    graph = Graph("g")
    x = graph.add_input(Value("x", TensorProto.FLOAT, (2,)))
    with Journal():
        graph.add_node("Relu", [x], 1)
        x.shape = (4,)
    assert len(graph) == 1 and x.shape == (4,)


def test_only_one_journal_is_open_at_a_time():
    with Journal():
        with pytest.raises(RuntimeError, match="already open"):
            Journal().open()
    assert not is_open()


def test_journals_nest_in_a_savepoint_which_undoes_them_all(tmp_path):
    """A savepoint around a run of passes: each pass's journal nests in it (one that fails is undone alone);
    rolling the savepoint back undoes every pass, kept or not, and what was made in between."""
    from onnx import save

    save(if_model(), str(tmp_path / "if.onnx"))
    model = load_model(tmp_path / "if.onnx")
    before, links = serialized(model), uses_of(model)
    savepoint = Journal(model, savepoint=True)
    with savepoint:
        with Journal(model):  # a pass that is kept
            relu = model.graph.nodes_of_type("Relu")[0]
            relu.op_type = "Sigmoid"
            model.graph.add_node("Neg", [relu.output()], ["made_in_a_pass"])
        kept = serialized(model)
        failed = Journal(model)
        with failed:  # a pass that fails: undone alone
            relu.op_type = "Tanh"
            edit_everything(model)
        failed.rollback()
        assert serialized(model) == kept and is_open()
        model.graph.toposort()  # between passes, in the savepoint itself
        model.metadata["between"] = "passes"
    assert not is_open() and serialized(model) != before
    savepoint.rollback()
    assert serialized(model) == before and uses_of(model) == links
    verify_graph(model.graph)
    with pytest.raises(RuntimeError, match="already open"):  # outside a savepoint, still one at a time
        with Journal():
            Journal().open()
    assert not is_open()
