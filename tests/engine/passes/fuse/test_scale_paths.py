"""fold_scale_axis, travelling scalars: an attention scale absorbed backward, a Gelu's 0.5 forward."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "fold_scale_axis"


def attention_scores(scale_node):
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"]), helper.make_node("Add", ["bq", "q0"], ["q1"]),
             helper.make_node("Reshape", ["q1", "heads"], ["q2"]),
             helper.make_node("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["x", "wk"], ["k0"]), helper.make_node("Reshape", ["k0", "heads"], ["k1"]),
             helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), scale_node]
    inits = [tensor("wq", floats(8, 8)), tensor("bq", floats(8, seed=2)), tensor("wk", floats(8, 8, seed=3)),
             tensor("heads", np.array([2, 4, 2, 4], np.int64)), tensor("k", np.float32(0.125))]
    return inferred_model(nodes, [vinfo("x", shape=[2, 4, 8])], ["y"], inits)


def test_attention_scale_goes_into_the_query_weights_and_bias(tmp_path):
    out = optimize(tmp_path, attention_scores(helper.make_node("Mul", ["s", "k"], ["y"], name="scale")), [PASS])
    assert "Mul" not in out.ops and len(out.ops) == 8
    assert out.model.graph.outputs[0].name == "y"
    assert "k" not in out.model.graph.initializers


def test_division_by_a_scalar_travels_too(tmp_path):
    out = optimize(tmp_path, attention_scores(helper.make_node("Div", ["s", "k"], ["y"])), [PASS])
    assert "Div" not in out.ops


def test_gelu_half_goes_forward_into_the_next_matmul(tmp_path):
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["half", "a"], ["m"], name="half_mul"),
             helper.make_node("Mul", ["x", "m"], ["g"]), helper.make_node("MatMul", ["g", "w"], ["y"])]
    inits = [tensor("one", np.float32(1)), tensor("half", np.float32(0.5)), tensor("w", floats(8, 5))]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=[2, 8])], ["y"], inits), [PASS])
    assert out.ops == ["Erf", "Add", "Mul", "MatMul"]


def test_scale_whose_path_is_shared_is_refused(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Mul", ["h", "k"], ["y"], name="scale")]
    inits = [tensor("w", floats(8, 5)), tensor("k", np.float32(3.0))]
    out = optimize(tmp_path, inferred_model(nodes, [vinfo("x", shape=[2, 8])], ["y", "r"], inits), [PASS])
    assert out.ops == ["MatMul", "Relu", "Mul"]
    assert out.refused("no Conv, Gemm or MatMul with constant weights is reachable backward from Mul 'scale'")


def _every_value(path, names, feeds):
    """The values ``names`` take in the model at ``path`` on ``feeds`` (each made a graph output)."""
    import onnx
    import onnxruntime

    proto = onnx.load(str(path))
    proto.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_the_values_a_travelling_scale_changes_lose_their_names(tmp_path):
    """NFNet's gated residual, Mul(Mul(Conv(x) * Sigmoid(z), 2.0), gain): the scalars go back into the
    Conv, so the Conv's output and the gated product hold other values than before. A name both graphs keep
    must mean the same value in both (verification by regions pairs values by name)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Sigmoid", ["z"], ["g"]),
             helper.make_node("Mul", ["c", "g"], ["m"]), helper.make_node("Mul", ["m", "two"], ["m2"]),
             helper.make_node("Mul", ["m2", "gain"], ["y"])]
    inits = [tensor("w", floats(4, 3, 1, 1)), tensor("b", floats(4, seed=2)), tensor("two", np.float32(2.0)),
             tensor("gain", np.float32(0.3))]
    model = inferred_model(nodes, [vinfo("x", shape=[1, 3, 5, 5]), vinfo("z", shape=[1, 4, 5, 5])], ["y"], inits)
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Conv", "Sigmoid", "Mul"]
    after = [v.name for node in out.model.graph for v in node.outputs]
    shared = sorted(set(after) & {"c", "g", "m", "m2", "y"})
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32),
             "z": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    before_values = _every_value(tmp_path / "before.onnx", shared, feeds)
    after_values = _every_value(out.path, shared, feeds)
    assert "y" in shared
    for name in shared:
        np.testing.assert_allclose(after_values[name], before_values[name], rtol=1e-5, atol=1e-6, err_msg=name)
