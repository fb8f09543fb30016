"""The pattern matcher: matches from the op-type index, outside uses, overlaps, commutative inputs, rules."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import LIGHT, make_model, run_onnxruntime, tensor, vinfo
from worker.ir import Graph, load_model, save_model
from worker.ir.verify import verify_graph
from worker.options import OptimizeOptions
from worker.passes import PassContext
from worker.pattern import Pattern, Rule, apply_rules, find_matches
from worker.places import parse_places


def load(tmp_path, model) -> "object":
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return load_model(path)


def relu_relu() -> Pattern:
    p = Pattern("relu_relu")
    x, mid, out = p.var("x"), p.var("mid"), p.var("out")
    p.op("first", "Relu", inputs=[x], outputs=[mid])
    p.op("second", "Relu", inputs=[mid], outputs=[out])
    return p


def relus(n: int, extra=()):
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"r{i}") for i in range(n)]
    return nodes + list(extra)


def test_conv_relu_on_a_real_model():
    graph = load_model(LIGHT / "light_squeezenet.onnx").graph
    p = Pattern("conv_relu")
    conv_out = p.var("y")
    p.op("conv", "Conv", inputs=[p.var("x"), p.var("w")], outputs=[conv_out])
    p.op("relu", "Relu", inputs=[conv_out], outputs=[p.var("out")])
    matches = find_matches(graph, p)
    assert len(matches) == len(graph.nodes_of_type("Conv")) == 26
    assert all(m["relu"].input(0) is m["y"] and m["conv"].output() is m["y"] for m in matches)
    assert matches[0].intermediate_values == [matches[0]["y"]]


def test_overlapping_matches_first_come_first_served(tmp_path):
    model = load(tmp_path, make_model(relus(3), [vinfo("v0", shape=[2])], [vinfo("v3", shape=[2])]))
    matches = find_matches(model.graph, relu_relu())
    assert [(m["first"].name, m["second"].name) for m in matches] == [("r0", "r1")]  # (r1, r2) overlaps


def test_intermediate_used_outside_the_match_is_refused(tmp_path):
    extra = [helper.make_node("Neg", ["v1"], ["n"], name="outside")]
    model = load(tmp_path, make_model(relus(2, extra), [vinfo("v0", shape=[2])],
                                      [vinfo("v2", shape=[2]), vinfo("n", shape=[2])]))
    assert find_matches(model.graph, relu_relu()) == []


def test_intermediate_that_is_a_graph_output_is_refused(tmp_path):
    model = load(tmp_path, make_model(relus(2), [vinfo("v0", shape=[2])],
                                      [vinfo("v2", shape=[2]), vinfo("v1", shape=[2])]))
    assert find_matches(model.graph, relu_relu()) == []


def test_intermediate_used_inside_a_nested_body_is_refused(tmp_path):
    body = helper.make_graph([helper.make_node("Neg", ["v1"], ["t"])], "b", [], [vinfo("t", shape=[2])])
    extra = [helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body)]
    model = load(tmp_path, make_model(relus(2, extra), [vinfo("v0", shape=[2]), vinfo("c", 9, [])],
                                      [vinfo("v2", shape=[2]), vinfo("z", shape=[2])]))
    assert find_matches(model.graph, relu_relu()) == []


def add_const_pattern(commutative: bool) -> Pattern:
    p = Pattern("add_const")
    p.op("add", "Add", inputs=[p.var("x"), p.var("c").const()], outputs=[p.var("out")], commutative=commutative)
    return p


def test_commutative_inputs_match_in_either_order(tmp_path):
    nodes = [helper.make_node("Add", ["c1", "x"], ["a"], name="const_first"),
             helper.make_node("Add", ["a", "c2"], ["b"], name="const_second")]
    model = load(tmp_path, make_model(nodes, [vinfo("x", shape=[2])], [vinfo("b", shape=[2])],
                                      [tensor("c1", np.ones(2, np.float32)), tensor("c2", np.ones(2, np.float32))]))
    both = find_matches(model.graph, add_const_pattern(commutative=True))
    assert [m["add"].name for m in both] == ["const_first", "const_second"]
    assert both[0]["c"].name == "c1" and both[0]["x"].name == "x"
    ordered = find_matches(model.graph, add_const_pattern(commutative=False))
    assert [m["add"].name for m in ordered] == ["const_second"]


def test_assertions_filter_candidates(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Transpose", ["b"], ["t1"], perm=[1, 0]),
             helper.make_node("Transpose", ["b"], ["t2"], perm=[0, 1])]
    model = load(tmp_path, make_model(nodes, [vinfo("x", shape=[2, 2])],
                                      [vinfo("t1", shape=[2, 2]), vinfo("t2", shape=[2, 2])]))
    p = Pattern("identity_transpose")
    p.op("t", "Transpose", inputs=[p.var("x")], outputs=[p.var("y")]).attr("perm", [0, 1])
    assert [m["y"].name for m in find_matches(model.graph, p)] == ["t2"]
    q = Pattern("single")
    q.op("r", "Relu", inputs=[q.var("x")], outputs=[q.var("y").single_use()])
    assert [m["y"].name for m in find_matches(model.graph, q)] == ["a"]  # b has two consumers


def test_candidates_come_from_the_op_type_index(monkeypatch):
    graph = load_model(LIGHT / "light_resnet50.onnx").graph
    relu = graph.nodes_of_type("Relu")[0]
    graph.add_node("Sigmoid", [relu.output()], after=relu)  # an edit the index must know about

    def no_scan(self):
        raise AssertionError("the matcher scanned the whole graph")

    monkeypatch.setattr(Graph, "__iter__", no_scan)
    p = Pattern("sigmoid")
    p.op("s", "Sigmoid", inputs=[p.var("x")], outputs=[p.var("y")])
    assert len(find_matches(graph, p)) == 1


def test_disconnected_pattern_is_refused():
    p = Pattern("broken")
    p.op("a", "Relu", inputs=[p.var("x")], outputs=[p.var("y")])
    p.op("b", "Relu", inputs=[p.var("u")], outputs=[p.var("v")])
    with pytest.raises(ValueError, match="not connected"):
        find_matches(Graph(), p)


class ReluReluRule(Rule):
    """Relu(Relu(x)) -> Relu(x); refused when the outer relu is named 'keep' (to test refusals)."""

    name = "relu_relu_eliminate"

    def build_pattern(self) -> Pattern:
        return relu_relu()

    def check(self, ctx, match):
        return "the node asks to be kept" if match["second"].name == "keep" else None

    def rewrite(self, ctx, match):
        return ctx.graph.add_node("Relu", [match["x"]], outputs=[match["out"]], before=match["second"])


def test_rule_rewrites_and_records_refusals(tmp_path):
    nodes = relus(2) + [helper.make_node("Relu", ["v2"], ["v3"], name="r2"),
                        helper.make_node("Relu", ["v3"], ["v4"], name="keep")]
    model = load(tmp_path, make_model(nodes, [vinfo("v0", shape=[3])], [vinfo("v4", shape=[3])]))
    ctx = PassContext(model, OptimizeOptions(), parse_places())
    result = apply_rules(ctx, [ReluReluRule()])
    verify_graph(model.graph)
    assert result.rewrites == 1 and result.details[0]["from"] == ["r0", "r1"]
    assert result.refusals == {"relu_relu_eliminate: the node asks to be kept": 1}
    assert [n.op_type for n in model.graph] == ["Relu", "Relu", "Relu"]
    assert model.graph.outputs[0].name == "v4"
    out = tmp_path / "out.onnx"
    save_model(model, out)
    x = np.array([-1, 0, 2], np.float32)
    np.testing.assert_array_equal(run_onnxruntime(out, {"v0": x})[0], np.maximum(x, 0))
