"""fuse_consecutive_transposes: two Transposes compose into one, or vanish when they cancel."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_transposes"]


def chain(p1, p2, out_shape, extra_reader=False):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=p1),
             helper.make_node("Transpose", ["t"], ["u"], **({"perm": p2} if p2 is not None else {})),
             helper.make_node("Neg", ["u"], ["y"])]
    outputs = [vinfo("y", shape=list(out_shape))]
    if extra_reader:
        nodes.append(helper.make_node("Abs", ["t"], ["z"]))
        outputs.append(vinfo("z", shape=list(np.empty((2, 3, 4)).transpose(p1).shape)))
    return make_model(nodes, [vinfo("x", shape=[2, 3, 4])], outputs)


def test_transposes_that_cancel_vanish(tmp_path):
    outcome = run(chain([0, 2, 1], [0, 2, 1], (2, 3, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_transposes_compose_into_one(tmp_path):
    outcome = run(chain([1, 0, 2], [2, 0, 1], (4, 3, 2)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Transpose", "Neg"]
    assert outcome.model.graph.nodes_of_type("Transpose")[0].attr("perm") == [2, 1, 0]


def test_default_permutation_is_the_reversal(tmp_path):
    outcome = run(chain([2, 1, 0], None, (2, 3, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_first_transpose_read_elsewhere_stays(tmp_path):
    outcome = run(chain([1, 0, 2], [1, 0, 2], (2, 3, 4), extra_reader=True), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Transpose", "Neg", "Abs"]
    assert outcome.model.graph.nodes_of_type("Neg")[0].input(0).name == "a"


def around(middle: str, axes, p1, p2, in_shape, opset=17):
    """Relu -> Transpose(p1) -> middle(axes) -> Transpose(p2) -> Neg: a unit axis dropped or inserted between
    two Transposes (TorchScript writes MobileNetV4's k as Transpose(0, 2, 1) -> Unsqueeze(1) ->
    Transpose(0, 1, 3, 2))."""
    from onnx import TensorProto

    axes_in = opset >= 13
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=p1),
             helper.make_node(middle, ["t", "axes"] if axes_in else ["t"], ["s"],
                              **({} if axes_in else {"axes": axes})),
             helper.make_node("Transpose", ["s"], ["u"], perm=p2), helper.make_node("Neg", ["u"], ["y"])]
    t = np.empty(in_shape).transpose(p1)
    s = np.expand_dims(t, tuple(axes)) if middle == "Unsqueeze" else np.squeeze(t, tuple(axes))
    inits = [helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)] if axes_in else []
    return make_model(nodes, [vinfo("x", shape=list(in_shape))], [vinfo("y", shape=list(s.transpose(p2).shape))],
                      inits, opset=opset)


def test_transposes_that_cancel_across_an_unsqueeze_vanish(tmp_path):
    outcome = run(around("Unsqueeze", [1], [0, 2, 1], [0, 1, 3, 2], (1, 8, 4)),
                  [*STEP, "eliminate_nop_transpose"], tmp_path)
    assert outcome.ops == ["Relu", "Unsqueeze", "Neg"]


def test_transposes_compose_across_an_unsqueeze(tmp_path):
    outcome = run(around("Unsqueeze", [0, 3], [2, 0, 1], [1, 4, 2, 0, 3], (2, 3, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Unsqueeze", "Transpose", "Neg"]


def test_transposes_compose_across_a_squeeze(tmp_path):
    """Axes given as an attribute before opset 13, as an input from it on."""
    for opset in (11, 17):
        outcome = run(around("Squeeze", [0, 2], [1, 0, 3, 2], [1, 0], (4, 1, 3, 1), opset=opset), STEP,
                      tmp_path / str(opset))
        assert outcome.ops == ["Relu", "Squeeze", "Transpose", "Neg"]


def test_a_middle_op_read_elsewhere_stays(tmp_path):
    proto = around("Unsqueeze", [1], [0, 2, 1], [0, 1, 3, 2], (1, 8, 4))
    proto.graph.node.append(helper.make_node("Abs", ["s"], ["z"]))
    proto.graph.output.append(vinfo("z", shape=[1, 1, 4, 8]))
    outcome = run(proto, STEP, tmp_path)
    assert outcome.ops.count("Transpose") == 2
