"""The pattern matcher and the rule driver: patterns as expressions, outside readers, commutative inputs, the
anchor, plans, forwarding, refusals, and the cleanup after each rewrite."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import LIGHT, make_model, run_onnxruntime, tensor, vinfo
from worker.engine.ir import Graph, load_model, save_model
from worker.engine.ir.verify import verify_graph
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext
from worker.engine.pattern import Match, Matcher, Pattern, Rule, apply_rules
from worker.engine.places import parse_places


def load(tmp_path, model):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return load_model(path)


def context(model) -> PassContext:
    return PassContext(model, OptimizeOptions(), parse_places())


def relu_relu() -> Pattern:
    p = Pattern("relu_relu")
    p.Relu(p.Relu(p.var("x"), key="first", out="mid"), key="second", out="out")
    return p


def relus(n: int, extra=()):
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"r{i}") for i in range(n)]
    return nodes + list(extra)


def bindings(graph: Graph, pattern: Pattern, node_name: str) -> list:
    matcher = Matcher(pattern)
    anchor, candidates = matcher.candidates(graph)
    node = next(n for n in candidates if n.name == node_name)
    return list(matcher.matches(anchor, node))


def test_an_expression_declares_ops_vars_and_the_output():
    p = relu_relu()
    assert list(p.ops) == ["first", "second"] and set(p.vars) == {"x", "mid", "out"}
    assert p.vars["mid"].is_intermediate and not p.vars["x"].is_intermediate and p.output is p.vars["out"]
    q = Pattern("auto")
    q.Add(q.Mul(q.var("x"), q.var("k")), q.var("b"))
    assert list(q.ops) == ["mul", "add"] and q.output.key == "add:0"
    with pytest.raises(ValueError, match="already has a node 'x'"):
        q.var("x")


@pytest.mark.models
def test_conv_relu_on_a_real_model():
    graph = load_model(LIGHT / "light_squeezenet.onnx").graph
    p = Pattern("conv_relu")
    p.Relu(p.Conv(p.var("x"), p.var("w"), key="conv", out="y"), key="relu", out="out")
    matches = Matcher(p).find(graph)
    assert len(matches) == len(graph.nodes_of_type("Conv")) == 26
    assert all(m["relu"].input(0) is m["y"] and m["conv"].output() is m["y"] for m in matches)
    assert matches[0].intermediate_values == [matches[0]["y"]] and matches[0].output is matches[0]["out"]


def test_find_takes_disjoint_matches_first_come_first_served(tmp_path):
    model = load(tmp_path, make_model(relus(3), [vinfo("v0", shape=[2])], [vinfo("v3", shape=[2])]))
    matches = Matcher(relu_relu()).find(model.graph)
    assert [(m["first"].name, m["second"].name) for m in matches] == [("r0", "r1")]  # (r1, r2) overlaps


def test_an_intermediate_read_outside_the_match_is_refused_with_the_reader(tmp_path):
    extra = [helper.make_node("Neg", ["v1"], ["n"], name="outside")]
    model = load(tmp_path, make_model(relus(2, extra), [vinfo("v0", shape=[2])],
                                      [vinfo("v2", shape=[2]), vinfo("n", shape=[2])]))
    assert bindings(model.graph, relu_relu(), "r0") == ["the intermediate 'v1' is also read by Neg 'outside'"]
    assert Matcher(relu_relu()).find(model.graph) == []


def test_an_intermediate_that_is_a_graph_output_is_refused(tmp_path):
    model = load(tmp_path, make_model(relus(2), [vinfo("v0", shape=[2])],
                                      [vinfo("v2", shape=[2]), vinfo("v1", shape=[2])]))
    assert bindings(model.graph, relu_relu(), "r0") == ["the intermediate 'v1' is also a graph output"]


def test_an_intermediate_read_inside_a_nested_body_is_refused(tmp_path):
    body = helper.make_graph([helper.make_node("Neg", ["v1"], ["t"], name="inner")], "b", [],
                             [vinfo("t", shape=[2])])
    extra = [helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body)]
    model = load(tmp_path, make_model(relus(2, extra), [vinfo("v0", shape=[2]), vinfo("c", 9, [])],
                                      [vinfo("v2", shape=[2]), vinfo("z", shape=[2])]))
    found = bindings(model.graph, relu_relu(), "r0")
    assert len(found) == 1 and found[0].startswith("the intermediate 'v1' is also read by Neg")


def test_a_match_never_spans_a_body_and_the_graph_around_it(tmp_path):
    body = helper.make_graph([helper.make_node("Relu", ["v1"], ["t"], name="inner")], "b", [],
                             [vinfo("t", shape=[2])])
    nodes = relus(1) + [helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body)]
    model = load(tmp_path, make_model(nodes, [vinfo("v0", shape=[2]), vinfo("c", 9, [])], [vinfo("z", shape=[2])]))
    assert bindings(model.graph, relu_relu(), "r0") == []


def add_const_pattern(commutative: bool) -> Pattern:
    p = Pattern("add_const")
    p.Add(p.var("x"), p.var("c").const(), key="add", out="out", commutative=commutative)
    return p


def test_commutative_inputs_match_in_either_order(tmp_path):
    nodes = [helper.make_node("Add", ["c1", "x"], ["a"], name="const_first"),
             helper.make_node("Add", ["a", "c2"], ["b"], name="const_second")]
    model = load(tmp_path, make_model(nodes, [vinfo("x", shape=[2])], [vinfo("b", shape=[2])],
                                      [tensor("c1", np.ones(2, np.float32)), tensor("c2", np.ones(2, np.float32))]))
    both = Matcher(add_const_pattern(commutative=True)).find(model.graph)
    assert [m["add"].name for m in both] == ["const_first", "const_second"]
    assert both[0]["c"].name == "c1" and both[0]["x"].name == "x"
    ordered = Matcher(add_const_pattern(commutative=False)).find(model.graph)
    assert [m["add"].name for m in ordered] == ["const_second"]


def test_attribute_and_node_assertions_filter_candidates(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Transpose", ["b"], ["t1"], perm=[1, 0]),
             helper.make_node("Transpose", ["b"], ["t2"], perm=[0, 1])]
    model = load(tmp_path, make_model(nodes, [vinfo("x", shape=[2, 2])],
                                      [vinfo("t1", shape=[2, 2]), vinfo("t2", shape=[2, 2])]))
    p = Pattern("identity_transpose")
    p.Transpose(p.var("x"), out="y", attrs={"perm": [0, 1]})
    assert [m["y"].name for m in Matcher(p).find(model.graph)] == ["t2"]

    def reads_a_relu(node) -> bool:
        """reads a Relu's output"""
        return node.input(0).producer is not None and node.input(0).producer.op_type == "Relu"

    q = Pattern("after_relu")
    q.Transpose(q.var("x"), out="y", when=reads_a_relu)
    assert [m["y"].name for m in Matcher(q).find(model.graph)] == ["t1", "t2"]
    assert q.ops["transpose"].assertions[0][0] == "reads a Relu's output"


def test_matching_starts_from_the_rarest_op_and_reads_only_the_index(monkeypatch):
    graph = load_model(LIGHT / "light_resnet50.onnx").graph
    relu = graph.nodes_of_type("Relu")[0]
    graph.add_node("Sigmoid", [relu.output()], after=relu)  # an edit the index must know about

    def no_scan(self):
        raise AssertionError("the matcher scanned the whole graph")

    monkeypatch.setattr(Graph, "__iter__", no_scan)
    p = Pattern("relu_sigmoid")
    p.Sigmoid(p.Relu(p.var("x"), key="relu").keep(), key="sigmoid")
    matcher = Matcher(p)
    assert matcher.anchor(graph).key == "sigmoid"  # one Sigmoid, 49 Relus
    assert len(matcher.find(graph)) == 1


def test_a_disconnected_pattern_is_an_error():
    p = Pattern("broken")
    p.Relu(p.var("x"))
    p.Relu(p.var("u"))
    with pytest.raises(ValueError, match="not connected"):
        Matcher(p)


class ReluRelu(Rule):
    """Relu(Relu(x)) -> Relu(x), forwarded; refused when the outer Relu is named 'keep', no candidate when it is
    named 'skip' (nothing in the trace)."""

    name = "relu_relu_eliminate"

    def build_pattern(self) -> Pattern:
        return relu_relu()

    def check(self, ctx, match: Match):
        name = match["second"].name
        return "the node asks to be kept" if name == "keep" else None if name == "skip" else match["mid"]


def run_rule(tmp_path, rule: Rule, nodes, inputs, outputs, initializers=()):
    model = load(tmp_path, make_model(nodes, inputs, outputs, initializers))
    result = apply_rules(context(model), [rule])
    verify_graph(model.graph)
    return model, result


def test_a_value_plan_is_forwarded_and_refusals_are_counted_with_their_sentence(tmp_path):
    nodes = relus(2) + [helper.make_node("Relu", ["v2"], ["v3"], name="keep"),
                        helper.make_node("Relu", ["v3"], ["v4"], name="skip")]
    model, result = run_rule(tmp_path, ReluRelu(), nodes, [vinfo("v0", shape=[3])], [vinfo("v4", shape=[3])])
    assert result.rewrites == 1 and result.details == [{"rule": "relu_relu_eliminate", "from": ["r0", "r1"],
                                                        "to": ["r0"]}]
    assert result.refusals == {"relu_relu_eliminate: the node asks to be kept": 1}
    assert [n.name for n in model.graph] == ["r0", "keep", "skip"] and model.graph.outputs[0].name == "v4"
    out = tmp_path / "out.onnx"
    save_model(model, out)
    x = np.array([-1, 0, 2], np.float32)
    np.testing.assert_array_equal(run_onnxruntime(out, {"v0": x})[0], np.maximum(x, 0))


def test_forwarding_that_would_lose_a_graph_output_name_is_refused(tmp_path):
    """Relu(Relu(x)) where x is a graph input and the result a graph output: nothing can take the name."""

    class ToInput(ReluRelu):
        def check(self, ctx, match):
            return match["x"]

    model, result = run_rule(tmp_path, ToInput(), relus(2), [vinfo("v0", shape=[3])], [vinfo("v2", shape=[3])])
    assert result.rewrites == 0 and len(model.graph) == 2
    assert list(result.refusals) == ["relu_relu_eliminate: 'v2' is a graph output and 'v0' is not produced by a "
                                     "node of the same graph, so the output cannot keep its name"]


class ScaleTwice(Rule):
    """Mul(Mul(x, a), b) -> Mul(x, a * b): the plan (the product) goes from check to rewrite."""

    name = "scale_twice"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.Mul(p.Mul(p.var("x"), p.var("a").const(), key="inner"), p.var("b").const(), key="outer", out="out")
        return p

    def check(self, ctx, match):
        return match["a"].constant_value() * match["b"].constant_value()

    def rewrite(self, ctx, match, product):
        factor = match.graph.add_initializer("factor", product)
        return match.graph.add_node("Mul", [match["x"], factor], outputs=[match["out"]], name="scaled",
                                    before=match["outer"])


def test_a_plan_reaches_the_rewrite_and_what_the_match_left_unused_goes(tmp_path):
    nodes = [helper.make_node("Constant", [], ["a"], value=tensor("a", np.float32(2)), name="const_a"),
             helper.make_node("Mul", ["x", "a"], ["m"], name="inner"),
             helper.make_node("Mul", ["m", "b"], ["y"], name="outer")]
    model, result = run_rule(tmp_path, ScaleTwice(), nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])],
                             [tensor("b", np.float32(3))])
    assert [n.name for n in model.graph] == ["scaled"] and set(model.graph.initializers) == {"factor"}
    assert float(model.graph.initializers["factor"].const) == 6.0
    assert result.details == [{"rule": "scale_twice", "from": ["inner", "outer", "const_a"], "to": ["scaled"]}]


def test_a_node_read_by_several_matches_is_rewritten_once_for_each(tmp_path):
    """One Relu read by three Relus: three matches anchored at it, all rewritten in one run."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="shared")] + \
        [helper.make_node("Relu", ["a"], [f"y{i}"], name=f"r{i}") for i in range(3)] + \
        [helper.make_node("Sum", ["y0", "y1", "y2"], ["z"], name="sum")]

    class Collapse(ReluRelu):
        def build_pattern(self):
            p = Pattern(self.name)
            p.Relu(p.Relu(p.var("x"), key="first", out="mid").keep(), key="second", out="out")
            return p

    model, result = run_rule(tmp_path, Collapse(), nodes, [vinfo("x", shape=[2])], [vinfo("z", shape=[2])])
    assert result.rewrites == 3 and [n.name for n in model.graph] == ["shared", "sum"]
    assert [v.name for v in model.graph.nodes_of_type("Sum")[0].inputs] == ["a", "a", "a"]
