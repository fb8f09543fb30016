"""target_opset: the model is raised to a newer opset by onnx's version converter before the passes run, so
fusions into newer ops apply; a lower target and an unconvertible model are refused with a sentence."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import make_model, save_proto, tensor, vinfo
from worker.engine.api import optimize
from worker.engine.errors import ModelError, OptionsError
from worker.engine.ir import load_model
from worker.engine.options import OptimizeOptions


def gelu_erf_model(opset: int) -> onnx.ModelProto:
    """x -> MatMul -> Gelu written out with Erf (the TorchScript exporter's form) -> Split at opset 17 style."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Div", ["h", "root"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["h", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [tensor("w", np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)),
             tensor("root", np.float32(math.sqrt(2))), tensor("one", np.float32(1)),
             tensor("half", np.float32(0.5))]
    return make_model(nodes, [vinfo("x", shape=[2, 16])], [vinfo("y", shape=[2, 16])], inits, opset=opset)


def run(tmp_path, proto, **options) -> dict:
    source = save_proto(proto, tmp_path / "in.onnx")
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(opt_level=1, **options))
    return report


def test_raising_to_20_lets_gelu_fuse(tmp_path):
    report = run(tmp_path, gelu_erf_model(17), target_opset=20)
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Gelu"]
    assert {(o.domain, o.version) for o in out.opset_import} >= {("", 20)}
    assert out.ir_version >= helper.find_min_ir_version_for([helper.make_opsetid("", 20)])
    assert report["verification"]["passed"]


def test_without_target_the_opset_17_chain_stays(tmp_path):
    run(tmp_path, gelu_erf_model(17))
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert "Erf" in [n.op_type for n in out.graph.node] and out.opset_import[0].version == 17


def test_weights_survive_the_conversion(tmp_path):
    """The converter works on the protobuf without large payloads; they are carried over by name."""
    proto = gelu_erf_model(13)
    path = save_proto(proto, tmp_path / "m.onnx")
    model = load_model(path, target_opset=23)
    assert model.opset() == 23
    np.testing.assert_array_equal(model.graph.value("w").constant_value(), onnx.numpy_helper.to_array(
        proto.graph.initializer[0]))


def test_a_lower_target_is_refused(tmp_path):
    with pytest.raises(OptionsError, match="target_opset 13 is below the model's opset 17: mirserve raises "
                                           "opsets, never lowers them"):
        run(tmp_path, gelu_erf_model(17), target_opset=13)


def test_an_unconvertible_model_is_refused_naming_the_converter(tmp_path):
    """An op of the default domain that onnx does not define has no schema to convert by."""
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g", [vinfo("x", shape=[2])],
                              [vinfo("y", shape=[2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ModelError, match="onnx's version converter cannot raise the opset from 17 to 23: .*"
                                         "no registered schema"):
        load_model(save_proto(proto, tmp_path / "old.onnx"), target_opset=23)


@pytest.mark.parametrize("value", [6, 99, True, "23"])
def test_out_of_range_targets_are_refused(value):
    with pytest.raises(OptionsError, match="option target_opset must be an integer from 7 to"):
        OptimizeOptions.from_dict({"target_opset": value})
