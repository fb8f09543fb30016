"""Model-local functions: their calls counted as what they expand to, refused when they never end, and replaced
by their bodies where no valid place runs them."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper

from tests.conftest import CORPUS, run_onnxruntime
from worker.engine.api import optimize
from worker.engine.errors import ModelError
from worker.engine.ir import Limits, load_model
from worker.engine.ir.functions import expanded_nodes, inline_calls
from worker.engine.limits import LimitError
from worker.engine.options import OptimizeOptions

LOCAL = helper.make_opsetid("local", 1)


def vi(name, shape=(2, 4)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def function(name, nodes, inputs=("a",), outputs=("b",), opset=17, attributes=()):
    return helper.make_function("local", name, list(inputs), list(outputs), nodes,
                                [helper.make_opsetid("", opset), LOCAL], attributes=list(attributes))


def call(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, domain="local", **attrs)


def model_with(functions, nodes, opset=17, inputs=("x",), outputs=("y",)):
    graph = helper.make_graph(nodes, "g", [vi(n) for n in inputs], [vi(n) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), LOCAL], functions=functions)
    model.ir_version = 8
    return model


def doubling(levels):
    """f_k calls f_{k-1} twice; f_0 is one Relu: the main graph's one call stands for 2^levels Relus."""
    functions = [function("f0", [helper.make_node("Relu", ["a"], ["b"])])]
    for k in range(1, levels + 1):
        functions.append(function(f"f{k}", [call(f"f{k - 1}", ["a"], ["t"]), call(f"f{k - 1}", ["t"], ["b"])]))
    return model_with(functions, [call(f"f{levels}", ["x"], ["y"])])


def save(model, tmp_path, name="model.onnx"):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_a_call_counts_as_the_nodes_its_body_expands_to(tmp_path):
    assert expanded_nodes(doubling(5), tmp_path) == 32
    assert expanded_nodes(doubling(0), tmp_path) == 1


def test_calls_doubling_forty_times_are_refused_before_anything_expands_them(tmp_path):
    path = save(doubling(40), tmp_path)
    with pytest.raises(LimitError, match=r"expand to 1,099,511,627,776 nodes, more than 2,000,000 \(limit max_nodes"):
        load_model(path)
    assert load_model(save(doubling(10), tmp_path, "ten.onnx"), limits=Limits(max_nodes=1024)).graph is not None
    with pytest.raises(LimitError, match="expand to 2,048 nodes"):
        load_model(save(doubling(11), tmp_path, "eleven.onnx"), limits=Limits(max_nodes=1024))


def test_a_function_that_reaches_a_call_of_itself_is_refused(tmp_path):
    ping = function("ping", [call("pong", ["a"], ["b"])])
    pong = function("pong", [helper.make_node("Relu", ["a"], ["t"]), call("ping", ["t"], ["b"])])
    with pytest.raises(ModelError, match=r"function 'local.ping' calls itself \(through 'local.ping' -> "
                                         r"'local.pong' -> 'local.ping'\), so its calls never end"):
        load_model(save(model_with([ping, pong], [call("ping", ["x"], ["y"])]), tmp_path))


def test_a_function_defined_twice_or_called_with_more_than_it_declares_is_refused(tmp_path):
    first, second = (function("f", [helper.make_node(op, ["a"], ["b"])]) for op in ("Neg", "Relu"))
    with pytest.raises(ModelError, match="function 'local.f' is defined twice"):
        load_model(save(model_with([first, second], [call("f", ["x"], ["y"])]), tmp_path))
    with pytest.raises(ModelError, match="node 'n' calls function 'local.f' with 2 inputs; it declares 1"):
        load_model(save(model_with([first], [call("f", ["x", "x"], ["y"], name="n")]), tmp_path))


def test_a_call_inside_a_body_nested_in_a_function_is_counted(tmp_path):
    then = helper.make_graph([call("f2", ["a"], ["r"])], "then", [], [vi("r")])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["r"])], "else", [], [vi("r")])
    outer = function("outer", [helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
                               helper.make_node("Greater", ["s", "zero"], ["c"]),
                               helper.make_node("If", ["c"], ["b"], then_branch=then, else_branch=other)])
    model = doubling(2)
    model.functions.append(outer)
    model.graph.node[0].op_type = "outer"
    # outer: ReduceSum, Greater, If, f2's 4 Relus, Neg
    assert expanded_nodes(model, tmp_path) == 8


def test_chosen_functions_are_inlined_and_the_others_stay_calls(tmp_path):
    model = doubling(2)
    inlined, counts = inline_calls(model, lambda domain, name: name != "f0", tmp_path)
    assert [n.op_type for n in inlined.graph.node] == ["f0"] * 4
    assert [f.name for f in inlined.functions] == ["f0"]
    assert counts == {("local", "f2", ""): 1}


def test_a_function_of_another_opset_is_converted_to_the_models(tmp_path):
    """Clip took its bounds as attributes up to opset 10: the body becomes Clip with bound inputs (onnxruntime
    itself reads the body at the model's opset and refuses the attributes)."""
    old = function("clip", [helper.make_node("Clip", ["a"], ["b"], min=0.0, max=6.0)], opset=10)
    inlined, _ = inline_calls(model_with([old], [call("clip", ["x"], ["y"])]), lambda d, n: True, tmp_path)
    clip = [n for n in inlined.graph.node if n.op_type == "Clip"]
    assert len(clip) == 1 and len(clip[0].input) == 3 and not clip[0].attribute
    feeds = {"x": np.linspace(-4, 10, 8, dtype=np.float32).reshape(2, 4)}
    onnx.save(inlined, tmp_path / "inlined.onnx")
    np.testing.assert_array_equal(run_onnxruntime(tmp_path / "inlined.onnx", feeds)[0], np.clip(feeds["x"], 0, 6))


def test_a_body_with_attribute_references_is_taken_as_it_is_only_where_its_ops_did_not_change(tmp_path):
    """The version converter would drop the references, so such a body is not converted."""
    def referring(op, opset):
        node = helper.make_node(op, ["a"], ["b"])
        node.attribute.append(AttributeProto(name="alpha", ref_attr_name="alpha", type=AttributeProto.FLOAT))
        return model_with([function("act", [node], opset=opset, attributes=["alpha"])],
                          [call("act", ["x"], ["y"], alpha=0.2)])

    inlined, _ = inline_calls(referring("Elu", 13), lambda d, n: True, tmp_path)  # Elu: since opset 6
    assert [(n.op_type, helper.get_attribute_value(n.attribute[0])) for n in inlined.graph.node] == \
        [("Elu", pytest.approx(0.2))]
    with pytest.raises(ModelError, match=r"function 'local.act' imports opset 13 of the default domain and the "
                                         r"model opset 17, and 'LeakyRelu' is not the same op in both"):
        inline_calls(referring("LeakyRelu", 13), lambda d, n: True, tmp_path)  # LeakyRelu: 16 added bfloat16


def local_function_model():
    """Nested calls, an attribute reference with a default and one given, and a domain only a body imports."""
    leaky = helper.make_node("LeakyRelu", ["a"], ["b"])
    leaky.attribute.append(AttributeProto(name="alpha", ref_attr_name="alpha", type=AttributeProto.FLOAT))
    scaled = function("scaled", [leaky])
    scaled.attribute_proto.append(helper.make_attribute("alpha", 0.5))
    block = helper.make_function("blocks", "block", ["a"], ["b"],
                                 [call("scaled", ["a"], ["t"], alpha=0.1), call("scaled", ["t"], ["u"]),
                                  helper.make_node("Add", ["u", "a"], ["b"])],
                                 [helper.make_opsetid("", 17), LOCAL])
    graph = helper.make_graph([helper.make_node("block", ["x"], ["h"], domain="blocks"),
                               helper.make_node("block", ["h"], ["y"], domain="blocks")],
                              "g", [vi("x")], [vi("y")])
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("blocks", 1), LOCAL]
    model = helper.make_model(graph, opset_imports=imports, functions=[scaled, block])
    model.ir_version = 8
    return model


def test_a_model_of_local_functions_is_optimized_and_verified(tmp_path):
    source = save(local_function_model(), tmp_path)
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions())
    assert report["model"]["input"]["inlined_functions"] == {"blocks.block": 2}
    assert report["verification"]["passed"] is True
    written = onnx.load(tmp_path / "out.onnx")
    assert not any(n.domain in ("local", "blocks") for n in written.graph.node)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    expected = run_onnxruntime(source, feeds)[0]
    np.testing.assert_allclose(run_onnxruntime(tmp_path / "out.onnx", feeds)[0], expected, rtol=1e-6, atol=1e-6)
    assert np.abs(expected).max() > 0.1  # the attribute given (0.1) and the default (0.5) both shape it


def test_a_plugin_kernel_keeps_its_function_a_call(tmp_path):
    """A function some valid place has a kernel for stays one node (here: the mirserve domain's Gelu)."""
    from worker.engine.api import functions_no_place_runs
    from worker.engine.kernels import default_table
    from worker.engine.places import parse_places

    choose = functions_no_place_runs(default_table(), parse_places("x86/fp32/nchw"))
    assert not choose("mirserve", "Gelu")
    assert choose("blocks", "block")
    assert choose("mirserve", "layout") and choose("mirserve", "NhwcConv")  # what an earlier run placed


@pytest.mark.parametrize("first, second", [("arm/fp16/nhwc,arm/fp32/nchw", "x86/fp32/nchw"),
                                           ("arm/fp16/nhwc,arm/fp32/nchw", "arm/fp16/nhwc,arm/fp32/nchw"),
                                           ("opencl/fp16/nchw,arm/fp32/nchw", "arm/fp16/nhwc,arm/fp32/nchw")])
def test_a_model_mirserve_optimized_is_optimized_again_for_other_places(tmp_path, first, second):
    """Its casts and NHWC forms are placement of the first run: inlined, placed anew (they were once kept as
    ops, and the second run read NHWC tensors as NCHW ones and cast them again)."""
    source = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    options = {"input_shapes": {"x": [1, 3, 48, 192]}}
    optimize(source, tmp_path / "once.onnx", OptimizeOptions(places=first, **options))
    for level in (0, 2):
        report = optimize(tmp_path / "once.onnx", tmp_path / f"twice{level}.onnx",
                          OptimizeOptions(places=second, opt_level=level))
        assert report["verification"]["passed"] is True
        inlined = report["model"]["input"]["inlined_functions"]
        assert inlined["mirserve.calib"] >= 1
        assert any(name.startswith("mirserve.Nhwc") for name in inlined) == ("nhwc" in first)
    feeds = {"x": np.random.default_rng(1).random((1, 3, 48, 192), dtype=np.float32)}
    np.testing.assert_allclose(run_onnxruntime(tmp_path / "twice2.onnx", feeds)[0],
                               run_onnxruntime(source, feeds)[0], atol=5e-3)


def tensor_parameter_model(referring_tensor: onnx.TensorProto | None = None):
    """y = x * k, with k a tensor attribute of the call that the body's Constant refers to (as torch's
    export_modules_as_functions passes each module's weights)."""
    constant = helper.make_node("Constant", [], ["k"])
    reference = AttributeProto(name="value", ref_attr_name="weight", type=AttributeProto.TENSOR)
    if referring_tensor is not None:
        reference.t.CopyFrom(referring_tensor)
    constant.attribute.append(reference)
    scale = function("scale", [constant, helper.make_node("Mul", ["a", "k"], ["b"])], attributes=["weight"])
    weight = onnx.numpy_helper.from_array(np.full((4,), 3.0, np.float32))
    return model_with([scale], [call("scale", ["x"], ["y"], weight=weight)])


def test_a_tensor_attribute_a_body_refers_to_is_read_from_the_call(tmp_path):
    source = save(tensor_parameter_model(), tmp_path)
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions())
    assert report["verification"]["passed"] is True
    feeds = {"x": np.ones((2, 4), np.float32)}
    np.testing.assert_array_equal(run_onnxruntime(tmp_path / "out.onnx", feeds)[0], np.full((2, 4), 3.0))


def test_a_reference_that_also_names_external_data_is_still_refused(tmp_path):
    named = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    named.data_location = onnx.TensorProto.EXTERNAL
    named.external_data.add(key="location", value="/etc/passwd")
    with pytest.raises(ModelError, match="external"):
        load_model(save(tensor_parameter_model(named), tmp_path))
