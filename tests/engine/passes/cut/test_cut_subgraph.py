"""cut_subgraph through optimize(): what is kept, what becomes an input or output, and every refusal."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import CORPUS, make_model, run_onnxruntime, save_proto, tensor, vinfo
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.cli import main
from worker.engine.errors import OptionsError

CLS = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.fixture
def chain(tmp_path):
    """x -> Relu -> a -> Neg -> b -> Abs -> c -> Sigmoid -> y, and b + z -> w (a second input and output)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Neg", ["a"], ["b"], name="neg"),
             helper.make_node("Abs", ["b"], ["c"], name="abs"), helper.make_node("Sigmoid", ["c"], ["y"], name="sig"),
             helper.make_node("Add", ["b", "z"], ["w"], name="add"),
             helper.make_node("Mul", ["z", "k"], ["v"], name="mul")]
    model = make_model(nodes, [vinfo("x", shape=[2, 3]), vinfo("z", shape=[2, 3])],
                       [vinfo("y", shape=[2, 3]), vinfo("w", shape=[2, 3]), vinfo("v", shape=[2, 3])],
                       [tensor("k", np.full((2, 3), 2.0, np.float32))])
    return save_proto(model, tmp_path / "chain.onnx")


def cut(path, tmp_path, start=(), end=(), **options):
    out = tmp_path / "cut.onnx"
    report = optimize(path, out, OptimizeOptions(cut_start=tuple(start), cut_end=tuple(end), opt_level=0,
                                                 **options))
    model = onnx.load(str(out))
    return model, report


def io(model: onnx.ModelProto) -> tuple[list[str], list[str], list[str]]:
    return ([v.name for v in model.graph.input], [n.name for n in model.graph.node],
            [v.name for v in model.graph.output])


def test_start_and_end_keep_only_what_lies_between(chain, tmp_path):
    model, report = cut(chain, tmp_path, ["a"], ["c"])
    assert io(model) == (["a"], ["neg", "abs"], ["c"])
    assert not model.graph.initializer  # k fed only what was cut away
    assert report["verification"]["passed"] is True and report["model"]["output"]["nodes"] == 2
    assert report["cut"] == {"start": ["a"], "end": ["c"], "inputs": ["a"], "outputs": ["c"], "nodes_before": 6,
                             "nodes": 2}
    (entry,) = [e for e in report["trace"] if e["pass"] == "cut_subgraph"]
    (detail,) = entry["details"]
    assert detail["rule"] == "cut_subgraph" and sorted(detail["from"]) == ["add", "mul", "relu", "sig"]
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (c,) = run_onnxruntime(tmp_path / "cut.onnx", {"a": a})
    np.testing.assert_allclose(c, np.abs(-a))


def test_a_node_between_that_reads_another_input_keeps_it(chain, tmp_path):
    model, _ = cut(chain, tmp_path, ["a"], ["w"])
    assert io(model) == (["a", "z"], ["neg", "add"], ["w"])


def test_without_an_end_the_outputs_that_depend_on_the_start_bound_the_cut(chain, tmp_path):
    model, report = cut(chain, tmp_path, start=["b"])
    assert io(model) == (["b", "z"], ["abs", "sig", "add"], ["y", "w"])  # v does not depend on b
    assert report["verification"]["passed"] is True


def test_without_a_start_the_model_inputs_bound_the_cut(chain, tmp_path):
    model, _ = cut(chain, tmp_path, end=["b", "v"])
    assert io(model) == (["x", "z"], ["relu", "neg", "mul"], ["b", "v"])


def test_an_end_inside_an_if_body_counts_its_holder_as_reached(tmp_path):
    then = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [], [vinfo("t", shape=[2])])
    other = helper.make_graph([helper.make_node("Abs", ["a"], ["e"])], "else", [], [vinfo("e", shape=[2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("ReduceSum", ["x"], ["sum"], name="sum", keepdims=0),
             helper.make_node("Greater", ["sum", "zero"], ["cond"], name="greater"),
             helper.make_node("If", ["cond"], ["r"], name="if", then_branch=then, else_branch=other),
             helper.make_node("Sigmoid", ["r"], ["y"], name="sig")]
    model = make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])],
                       [tensor("zero", np.zeros((), np.float32))])
    cut_model, report = cut(save_proto(model, tmp_path / "if.onnx"), tmp_path, ["a"], ["r"])
    assert io(cut_model) == (["a", "x"], ["sum", "greater", "if"], ["r"])
    assert report["verification"]["passed"] is True


@pytest.mark.parametrize("start, end, field, message", [
    (["nope"], [], "cut_start", "cut_start names 'nope', which is no value of the model's graph"),
    ([], ["n1", "n2"], "cut_end", "cut_end names 'n1', 'n2', which are no values of the model's graph"),
    (["k"], [], "cut_start", "cut_start names 'k', a weight of the model"),
    (["b"], ["a"], "cut_end", "cut_end 'a' cannot be reached from the cut start (b): it does not depend on it"),
    (["b", "z"], ["b"], "cut_end", "'b' is both a start and an end of the cut; nothing lies between"),
])
def test_each_refusal_names_the_value(chain, tmp_path, start, end, field, message):
    with pytest.raises(OptionsError) as raised:
        cut(chain, tmp_path, start, end)
    assert str(raised.value).startswith(message) and raised.value.field == field
    assert not (tmp_path / "cut.onnx").exists() and not list(tmp_path.glob(".mirserve-cut-*"))


def test_a_start_no_output_depends_on_leaves_nothing_to_keep(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["dead"])]
    path = save_proto(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])]), tmp_path / "m.onnx")
    with pytest.raises(OptionsError, match=r"^no output of the model depends on the cut start \(dead\)"):
        cut(path, tmp_path, ["dead"])


def test_the_options_take_lists_or_comma_separated_text():
    options = OptimizeOptions.from_dict({"cut_start": "a, b", "cut_end": ["c"]})
    assert (options.cut_start, options.cut_end) == (("a", "b"), ("c",))
    assert options.to_dict()["cut_start"] == ["a", "b"]
    with pytest.raises(OptionsError, match="option cut_end must be a list of value names"):
        OptimizeOptions.from_dict({"cut_end": [1]})


@pytest.mark.models
def test_a_cut_of_a_real_model_computes_what_the_part_computed_in_the_whole(tmp_path, capsys):
    """The classifier from its first residual Add to the last HardSwish, optimized at the default level."""
    start, end = "elementwise_add_0", "hardswish_14.tmp_0"
    out = tmp_path / "part.onnx"
    assert main(["optimize", str(CLS), "-o", str(out), "--input-shape", "x=1,3,48,192", "--cut-start", start,
                 "--cut-end", end, "--quiet"]) == 0
    whole = onnx.load(str(CLS))
    whole.graph.output.extend([helper.make_empty_tensor_value_info(start), helper.make_empty_tensor_value_info(end)])
    exposed = save_proto(whole, tmp_path / "exposed.onnx")
    x = np.random.default_rng(3).random((1, 3, 48, 192), dtype=np.float32)
    *_, middle, expected = run_onnxruntime(exposed, {"x": x})
    (actual,) = run_onnxruntime(out, {start: middle})
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    part = onnx.load(str(out))
    assert [v.name for v in part.graph.input] == [start] and [v.name for v in part.graph.output] == [end]
