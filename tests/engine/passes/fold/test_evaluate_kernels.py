"""The numpy kernels constant folding relies on agree with onnxruntime; fills come back as views."""
import numpy as np
import pytest
from onnx import TensorProto

from worker.engine.evaluate import _KERNELS, _onnxruntime, evaluate
from worker.engine.ir import Graph, Node, Value

RNG = np.random.default_rng(0)
F = RNG.standard_normal((3, 4)).astype(np.float32)
I = RNG.integers(-9, 9, (3, 4)).astype(np.int64)
NZ = np.where(I == 0, 3, I)


def node(op, inputs, dtype=TensorProto.FLOAT, outputs=1, **attributes):
    graph = Graph("g")
    values = [graph.add_input(Value(f"i{k}", 0, None)) if x is not None else None for k, x in enumerate(inputs)]
    made = graph.append(Node(op, values, [Value(f"o{k}", dtype, None) for k in range(outputs)]))
    for key, val in attributes.items():
        made.set_attr(key, val)
    return made


CASES = [
    ("Relu", [F], {}), ("Sigmoid", [F], {}), ("Tanh", [F], {}), ("Sin", [F], {}), ("Cos", [F], {}),
    ("Sign", [F], {}), ("Round", [F * 3], {}), ("Pow", [np.abs(F), np.float32(1.5)], {}),
    ("Mod", [I, NZ], {}), ("Mod", [F, np.float32(0.7)], {"fmod": 1}), ("Clip", [F, np.float32(-0.5), None], {}),
    ("Sum", [F, F, F], {}), ("Mean", [F, F * 2], {}), ("MatMul", [F, F.T.copy()], {}),
    ("CastLike", [F, np.zeros(1, np.int64)], {}),
    # Flatten's axis runs to the rank (DETR flattens its (1, 64) mask at axis 2 into (64, 1)), and below 0
    ("Flatten", [F], {"axis": 2}), ("Flatten", [F], {"axis": 0}), ("Flatten", [F], {"axis": -1}),
    ("Flatten", [F[None]], {"axis": -3}),
]


@pytest.mark.parametrize("op, inputs, attributes", CASES, ids=[c[0] for c in CASES])
def test_numpy_kernels_agree_with_onnxruntime(op, inputs, attributes):
    dtype = TensorProto.INT64 if op == "CastLike" or inputs[0].dtype == np.int64 else TensorProto.FLOAT
    made = node(op, inputs, dtype, **attributes)
    ours = _KERNELS[op](made, list(inputs), 17)
    theirs = _onnxruntime(made, inputs, 17)
    assert ours is not None and theirs is not None
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_clip_before_opset_11_reads_attributes():
    made = node("Clip", [F], min=-0.5, max=0.5)
    np.testing.assert_array_equal(evaluate(made, [F], 9)[0], np.clip(F, -0.5, 0.5))


def test_fills_and_expands_are_views():
    fill = node("ConstantOfShape", [np.array([1024, 1024])],
                value=np.array([0.5], np.float32))
    out = evaluate(fill, [np.array([1024, 1024], np.int64)], 17)[0]
    assert out.shape == (1024, 1024) and out.strides == (0, 0) and out.dtype == np.float32
    expand = node("Expand", [F[:1], np.array([5, 3, 4])])
    out = evaluate(expand, [F[:1], np.array([5, 3, 4], np.int64)], 17)[0]
    assert out.shape == (5, 3, 4) and out.strides[0] == 0 and not out.flags.writeable


def test_ops_without_a_kernel_use_onnxruntime_when_asked():
    made = node("Erf", [F])
    assert "Erf" not in _KERNELS
    np.testing.assert_allclose(evaluate(made, [F], 17, runtime=True)[0], _onnxruntime(made, [F], 17)[0])
    assert evaluate(node("Mystery", [F]), [F], 17, runtime=True) is None


def test_a_batch_runs_in_one_session_and_a_node_it_rejects_gets_none():
    from worker.engine.evaluate import evaluate_on_onnxruntime

    scale, zero = np.float32(0.02), np.uint8(128)
    good = node("QuantizeLinear", [F, scale, zero], dtype=TensorProto.UINT8)
    other = node("QuantizeLinear", [F * 2, scale, zero], dtype=TensorProto.UINT8)
    bad = node("QuantizeLinear", [F, np.full(7, 0.1, np.float32), np.zeros(7, np.uint8)], dtype=TensorProto.UINT8,
               axis=1)  # 7 scales for an axis of 4
    answers = evaluate_on_onnxruntime([(good, [F, scale, zero]), (other, [F * 2, scale, zero]),
                                       (bad, [F, np.full(7, 0.1, np.float32), np.zeros(7, np.uint8)])], 13)
    assert answers[2] is None
    for (made, inputs), answer in zip([(good, [F, scale, zero]), (other, [F * 2, scale, zero])], answers):
        np.testing.assert_array_equal(answer[0], _onnxruntime(made, inputs, 13)[0])
