"""fuse_consecutive_reshapes: a Reshape after a view op reads the view's input; copies (0) are resolved."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_reshapes"]


def chain(first, s2, x_shape, out_shape, initializers=()):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), first, helper.make_node("Reshape", ["t", "s2"], ["u"]),
             helper.make_node("Neg", ["u"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape))],
                      [tensor("s2", np.array(s2, np.int64)), *initializers])


def test_reshape_reshape_becomes_one_with_a_symbolic_batch(tmp_path):
    first = helper.make_node("Reshape", ["a", "s1"], ["t"])
    model = chain(first, [0, 4, 6], ("n", 24), ("n", 4, 6), [tensor("s1", np.array([0, 2, 12], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Neg"]
    assert outcome.model.graph.nodes_of_type("Reshape")[0].input(0).name == "a"


def test_flatten_then_reshape_back_vanishes(tmp_path):
    first = helper.make_node("Flatten", ["a"], ["t"], axis=1)
    outcome = run(chain(first, [2, 3, 4], (2, 3, 4), (2, 3, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_copy_of_a_dim_only_the_middle_tensor_has_is_resolved(tmp_path):
    first = helper.make_node("Unsqueeze", ["a", "axes"], ["t"])
    model = chain(first, [0, 0, 12], (2, 12), (1, 2, 12), [tensor("axes", np.array([0], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Neg"]


def test_copy_of_an_unknown_dim_is_refused(tmp_path):
    first = helper.make_node("Reshape", ["a", "s1"], ["t"])
    model = chain(first, [0, -1], ("n", 24), ("m", "k"), [tensor("s1", np.array([-1, 12], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Reshape", "Reshape", "Neg"]
    assert outcome.refused(STEP[0], "copies a dim that is not known")


def reshape_then(second, x_shape, s1, out_shape, extra_reader=False):
    """Relu -> Reshape(s1) -> ``second`` -> Neg (TorchScript writes MobileNetV4's attention keys as
    Reshape(1, 64, -1) -> Unsqueeze(1))."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s1"], ["t"]), second,
             helper.make_node("Neg", ["u"], ["y"])]
    outputs = [vinfo("y", shape=list(out_shape))]
    if extra_reader:
        nodes.append(helper.make_node("Abs", ["t"], ["z"]))
        outputs.append(vinfo("z", shape=[1, 64, 4]))
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], outputs,
                      [tensor("s1", np.array(s1, np.int64)), tensor("axes", np.array([1], np.int64))])


def test_unsqueeze_squeeze_or_flatten_of_a_reshape_is_one_reshape(tmp_path):
    for second, out_shape in [(helper.make_node("Unsqueeze", ["t", "axes"], ["u"]), (1, 1, 64, 4)),
                              (helper.make_node("Squeeze", ["t", "axes"], ["u"]), (4, 64)),
                              (helper.make_node("Flatten", ["t"], ["u"], axis=2), (4, 64))]:
        s1 = [4, 1, 64] if second.op_type == "Squeeze" else [1, 64, -1] if second.op_type == "Unsqueeze" else \
            [4, 64, 1]
        outcome = run(reshape_then(second, (1, 64, 2, 2), s1, out_shape), STEP, tmp_path / second.op_type)
        assert outcome.ops == ["Relu", "Reshape", "Neg"], second.op_type
        reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
        assert reshape.input(0).name == "a" and reshape.output().name == "u"


def test_a_view_of_a_dynamic_shape_or_a_shared_reshape_stays(tmp_path):
    unsqueeze = helper.make_node("Unsqueeze", ["t", "axes"], ["u"])
    outcome = run(reshape_then(unsqueeze, ("n", 64, 2, 2), [0, 64, -1], ("n", 1, 64, 4)), STEP, tmp_path / "dyn")
    assert outcome.ops == ["Relu", "Reshape", "Unsqueeze", "Neg"]
    outcome = run(reshape_then(unsqueeze, (1, 64, 2, 2), [1, 64, -1], (1, 1, 64, 4), extra_reader=True), STEP,
                  tmp_path / "shared")
    assert outcome.ops == ["Relu", "Reshape", "Unsqueeze", "Neg", "Abs"]
