"""The evaluator on empty tensors, 0-d scalars, NaN and infinities, integer extremes and zero divisors: every
numpy kernel either computes what onnxruntime computes (which verification compares against) or declines.

A kernel may decline (None) anywhere: the fold then asks onnxruntime itself. What it must never do is give a
value onnxruntime would not, or a value where onnxruntime fails, or hand onnxruntime an input that kills it.
"""
from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from onnx import TensorProto

from worker.engine.evaluate import evaluate
from worker.engine.ir import Graph, Node, Value

F = np.array([0.0, -0.0, 1.5, -2.5, np.nan, np.inf, -np.inf, 3e38, 1e-45, 131008.0], np.float32)
H = (np.random.default_rng(0).standard_normal(64) * 100).astype(np.float16)
I64 = np.array([0, 1, -1, np.iinfo(np.int64).max, np.iinfo(np.int64).min, 7, -7], np.int64)
I32 = np.array([0, 1, -1, np.iinfo(np.int32).max, np.iinfo(np.int32).min, 7, -7], np.int32)
SMALL = np.array([1, 2, -3, 4, 5], np.int64)
U8 = np.array([0, 255, 1], np.uint8)
B = np.array([True, False])
EMPTY = np.zeros((0, 3), np.float32)
SCALAR = np.array(2.5, np.float32)
#: Ops whose float results may differ from onnxruntime's vectorized math by a few ulps.
TRANSCENDENTAL = {"Exp", "Log", "Sigmoid", "Tanh", "Sin", "Cos", "Sqrt", "Reciprocal", "Pow"}

UNARY = ["Neg", "Abs", "Not", "Floor", "Ceil", "Sqrt", "Reciprocal", "Exp", "Log", "Relu", "Sigmoid", "Tanh",
         "Sin", "Cos", "Sign", "Round", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
          "Xor", "Max", "Min", "Pow", "Mod", "Sum", "Mean", "MatMul"]
REDUCE = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"]
CAST_TO = [TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.INT8, TensorProto.BOOL,
           TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.STRING,
           TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.INT4]


def i64(*values):
    return np.array(values, np.int64)


def cases():
    """(op, inputs, attributes, opset): the degenerate inputs of every kernel."""
    found = []
    for op in UNARY:
        found += [(op, [x], {}, 17) for x in (F, H, I64, I32, U8, B, EMPTY, SCALAR)]
    for op in BINARY:
        pairs = [(F, F[::-1].copy()), (H, H[::-1].copy()), (I64, I64[::-1].copy()), (I32, I32[::-1].copy()),
                 (EMPTY, np.ones((1, 3), np.float32)), (SCALAR, F), (U8, U8[::-1].copy()), (B, B[::-1].copy()),
                 (SMALL, np.array([2, -2, 3, 1, -5], np.int64))]
        found += [(op, [a, b], {}, 17) for a, b in pairs]
    found += [("Mod", [F, F[::-1].copy()], {"fmod": 1}, 17), ("Mod", [SMALL, i64(2, 3, 2, -3, 2)], {"fmod": 1}, 17)]
    for to in CAST_TO:
        found += [("Cast", [x], {"to": to}, 21)
                  for x in (F, I64, B, EMPTY, SCALAR, np.array(["1.5", "nan", "-INF", "abc", "1e40"]))]
    for op in REDUCE:
        for x in (EMPTY, np.zeros((2, 0), np.float32), np.zeros(0, np.int64), F, I64, SMALL, H, SCALAR):
            for axes in (None, i64(0), i64(-1), i64(1), np.zeros(0, np.int64)):
                found += [(op, [x, axes], {"keepdims": keep}, 18) for keep in (0, 1)]
    found += [
        ("Clip", [F, np.float32(-1), np.float32(1)], {}, 17), ("Clip", [F, np.float32(np.nan), np.float32(1)], {}, 17),
        ("Clip", [F, np.float32(2), np.float32(1)], {}, 17), ("Clip", [I64, np.int64(-1), np.int64(1)], {}, 17),
        ("Clip", [EMPTY, np.float32(0)], {}, 17),
        ("Range", [np.int64(0), np.int64(0), np.int64(1)], {}, 17),
        ("Range", [np.int64(5), np.int64(0), np.int64(-2)], {}, 17),
        ("Range", [np.float32(0), np.float32(1), np.float32(0.1)], {}, 17),
        ("Range", [np.float32(0), np.float32(np.inf), np.float32(1)], {}, 17),
        ("Where", [B, SCALAR, np.zeros((0, 1), np.float32)], {}, 17), ("Where", [np.array(True), F, SCALAR], {}, 17),
        ("Gather", [F, i64(-1, 0)], {"axis": 0}, 17), ("Gather", [EMPTY, np.zeros(0, np.int64)], {"axis": 0}, 17),
        ("Gather", [F, np.array(3, np.int64)], {}, 17), ("Gather", [F, i64(10)], {}, 17),
        ("Gather", [EMPTY, i64(0)], {"axis": 1}, 17),
        ("Concat", [EMPTY, np.ones((2, 3), np.float32)], {"axis": 0}, 17),
        ("Concat", [np.zeros(0, np.float32), np.zeros(0, np.float32)], {"axis": 0}, 17),
        ("Slice", [F, i64(-100), i64(100)], {}, 17), ("Slice", [F, i64(5), i64(2)], {}, 17),
        ("Slice", [F, i64(-1), i64(-2**63), i64(0), i64(-1)], {}, 17),
        ("Slice", [F, i64(2**63 - 1), i64(0), i64(0), i64(-3)], {}, 17),
        ("Slice", [F, i64(-2**63), i64(2**63 - 1), i64(0), i64(4)], {}, 17),
        ("Slice", [EMPTY, i64(0), i64(1), i64(0)], {}, 17),
        ("Slice", [F[:5].copy(), i64(-7), i64(-6), i64(0), i64(-2)], {}, 17),  # ONNX clamps start to 0
        ("Slice", [F, i64(0), i64(5), i64(0), i64(0)], {}, 17),
        # a negative step with the end at INT64_MAX or INT32_MAX runs to the first element in onnxruntime
        ("Slice", [F[:5].copy(), i64(-6), i64(2**63 - 1), i64(0), i64(-2)], {}, 17),
        ("Slice", [F[:5].copy(), i64(3), i64(2**31 - 1), i64(0), i64(-1)], {}, 17),
        ("Slice", [F[:5].copy(), i64(3), i64(2**63 - 2), i64(0), i64(-1)], {}, 17),
        ("Reshape", [EMPTY, i64(0, -1)], {}, 17), ("Reshape", [EMPTY, i64(-1)], {}, 17),
        ("Reshape", [EMPTY, i64(3, 0)], {"allowzero": 1}, 17), ("Reshape", [SCALAR, i64(1, 1)], {}, 17),
        ("Reshape", [np.ones(1, np.float32), np.zeros(0, np.int64)], {}, 17),
        ("Expand", [SCALAR, i64(0, 2)], {}, 17), ("Expand", [EMPTY, i64(2, 1, 1)], {}, 17),
        ("Tile", [EMPTY, i64(0, 2)], {}, 17), ("Tile", [F, i64(0)], {}, 17),
        ("ConstantOfShape", [np.zeros(0, np.int64)], {}, 17), ("ConstantOfShape", [i64(0, 3)], {}, 17),
        ("Squeeze", [np.zeros((1, 0, 1), np.float32)], {}, 17), ("Unsqueeze", [SCALAR, i64(0, -1)], {}, 17),
        ("Flatten", [EMPTY], {"axis": 0}, 17), ("Flatten", [np.zeros((2, 0, 3), np.float32)], {"axis": 2}, 17),
        ("Transpose", [EMPTY], {}, 17), ("Shape", [EMPTY], {"start": -1}, 17), ("Size", [EMPTY], {}, 17),
        ("NonZero", [SCALAR], {}, 17), ("NonZero", [EMPTY], {}, 17), ("NonZero", [F], {}, 17),
        ("CastLike", [F, np.zeros(0, np.int32)], {}, 17),
        ("MatMul", [np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)], {}, 17),
        ("MatMul", [I64.reshape(1, 7), I64.reshape(7, 1)], {}, 17),
        ("Pow", [SMALL, i64(2, 0, 3, 2, 2)], {}, 17),
    ]
    return found


def make(op, inputs, attributes, dtype=0) -> Node:
    graph = Graph("g")
    values = [graph.add_input(Value(f"i{k}", 0, None)) if x is not None else None for k, x in enumerate(inputs)]
    node = graph.append(Node(op, values, [Value("o0", dtype, None)]))
    for key, value in attributes.items():
        node.set_attr(key, value)
    return node


def same(ours: np.ndarray, theirs: np.ndarray, op: str) -> bool:
    if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
        return False
    if ours.dtype.kind == "f" and op in TRANSCENDENTAL:
        with np.errstate(invalid="ignore", over="ignore"):
            ulps = 4 * np.spacing(np.abs(theirs.astype(np.float64)).astype(ours.dtype)).astype(np.float64)
            close = np.abs(ours.astype(np.float64) - theirs.astype(np.float64)) <= ulps
        return bool(np.all(close | (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))))
    return bool(np.array_equal(ours, theirs, equal_nan=ours.dtype.kind == "f"))


CASES = cases()


@pytest.mark.parametrize("op, inputs, attributes, opset", CASES,
                         ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_numpy_kernels_compute_what_onnxruntime_computes_or_decline(op, inputs, attributes, opset):
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    inputs = [None if x is None else np.asarray(x) for x in inputs]
    node = make(op, inputs, attributes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = evaluate(node, inputs, opset, runtime=True)
    if ours is None:
        return  # declined: the node stays, the runtime computes it
    theirs = onnxruntime_or_error(node, inputs, opset)
    if isinstance(theirs, str):
        assert any(m in theirs for m in LACKS_KERNEL), f"{op} computed {ours[0]!r} where onnxruntime fails: {theirs}"
        return
    for a, b in zip(ours, theirs):
        a = np.asarray(a)
        assert same(a, b, op), f"{op}: ours {a.dtype}{list(a.shape)} {a.ravel()[:8]}, " \
                               f"onnxruntime {b.dtype}{list(b.shape)} {b.ravel()[:8]}"


#: onnxruntime failing for want of a kernel (or of a numpy type for its result), not because the input is
#: an error: any value is fine there.
LACKS_KERNEL = ("Could not find an implementation", "No corresponding Numpy type", "NOT_IMPLEMENTED")


def onnxruntime_or_error(node: Node, inputs: list, opset: int) -> list[np.ndarray] | str:
    import onnxruntime as ort

    from worker.engine.evaluate import _contiguous, _node_proto, _one_node_model

    model = _one_node_model(_node_proto(node, inputs), inputs, opset)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, {f"i{k}": _contiguous(x) for k, x in enumerate(inputs) if x is not None})
    except Exception as exc:
        return str(exc)


def test_a_scalar_goes_to_onnxruntime_as_a_scalar():
    """np.ascontiguousarray makes a 0-d array 1-d: a folded scalar came back as [1]."""
    x = np.array(0.5, np.float32)
    out = evaluate(make("Erf", [x], {}), [x], 17, runtime=True)
    assert out[0].shape == () and np.isclose(out[0], 0.5204999)


def test_integer_division_errors_are_left_to_the_runtime():
    """x / 0 fails at run time and INT_MIN / -1 kills onnxruntime with SIGFPE: neither is evaluated, not
    even by onnxruntime (this runs in a child process, so a regression kills only the child; one child for
    Div and Mod in both integer types, since a Python start with onnxruntime costs more than the cases)."""
    script = """
import numpy as np
from tests.engine.test_evaluate import make
from worker.engine.evaluate import evaluate
for op in ("Div", "Mod"):
    for dtype in (np.int32, np.int64):
        low = np.iinfo(dtype).min
        for a, b in (([7, 1], [0, 1]), ([low, 4], [-1, 2])):
            a, b = np.array(a, dtype), np.array(b, dtype)
            print(op, dtype.__name__, a.tolist(), b.tolist(), flush=True)
            assert evaluate(make(op, [a, b], {}), [a, b], 17, runtime=True) is None
print("ok")
"""
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and child.stdout.endswith("ok\n"), (child.stdout[-500:], child.stderr[-2000:])
