"""eliminate_nop_reshape: a view op to the shape its input has goes, symbolic dims included."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_reshape"]


def reshape_model(target, in_shape=("n", 256), opset=17, out_shape=("n", 256)):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["b"]),
             helper.make_node("Neg", ["b"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(in_shape))], [vinfo("y", shape=list(out_shape))],
                      [tensor("shape", np.array(target, dtype=np.int64))], opset=opset)


def test_reshape_to_the_same_symbolic_shape_is_removed(tmp_path):
    outcome = run(reshape_model([0, 256]), STEP, tmp_path, shapes=None)
    assert outcome.ops == ["Relu", "Neg"]


def test_reshape_with_one_wildcard_is_removed_and_a_real_reshape_stays(tmp_path):
    outcome = run(reshape_model([-1, 256]), STEP, tmp_path / "same")
    assert outcome.ops == ["Relu", "Neg"]
    outcome = run(reshape_model([-1, 128], out_shape=["m", 128]), STEP, tmp_path / "real")
    assert outcome.ops == ["Relu", "Reshape", "Neg"]
    assert outcome.refusals("eliminate_nop_reshape") != {}  # with a symbolic batch, equality is unknown


def test_flatten_squeeze_unsqueeze_to_the_same_shape_are_removed(tmp_path):
    nodes = [helper.make_node("Flatten", ["x"], ["a"], axis=1),
             helper.make_node("Squeeze", ["a", "none"], ["b"]),
             helper.make_node("Unsqueeze", ["b", "empty"], ["c"]),
             helper.make_node("Neg", ["c"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])],
                       [tensor("none", np.array([], dtype=np.int64)),
                        tensor("empty", np.array([], dtype=np.int64))], opset=13)
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Neg"]


def test_reshape_of_a_graph_input_to_a_graph_output_is_refused(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])],
                       [tensor("shape", np.array([2, 3], dtype=np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Reshape"] and outcome.refused("eliminate_nop_reshape", "graph output")
