"""Differential fuzzing: random but valid graphs of standard ops through optimize(), each compared with the input
on onnxruntime.

Each graph is drawn from ``numpy.random.default_rng([seed, index])``, so ``--seed S --only I`` rebuilds graph I
of run S exactly: chains and DAGs with broadcasting, 0-d and empty tensors, float, fp16, int and bool values,
Reshape / Transpose / Concat / Slice / Gather / Expand / Tile chains, Shape arithmetic, Conv / BatchNormalization
/ activation / pooling stacks, MatMul / Gemm / Add / LayerNormalization / Softmax blocks, reductions, Where,
If and Loop bodies, and constants (NaN and infinities among them) that fold. Each is optimized at a random opt
level (0, 1, 2), with a random valid place list, portable or not, and both models run on the same seeded inputs.

An outcome is ``ok``; ``refused`` (a user-facing error; counted, with the reason); ``invalid`` (the generated
graph does not run on onnxruntime: a bug of the generator, counted); or a failure: ``crash`` (an internal
error, or a user error caused by one), ``unloadable`` (the output no longer loads), ``mismatch`` (outputs
differ: element type, shape, or values beyond rtol 1e-4 / atol 1e-4, plus, for a model with fp16 values on
fp32 places, twice what computing them in fp32 moves; with an fp16 place, beyond fp16's rounding at the output's
magnitude; an output that widens an fp16 value by Cast holding an element that is no fp16 value), ``unsettled``
(a fixed point of passes stopped at its cap while still rewriting: rewrites undoing each other), ``timeout``.
A failing graph is shrunk (graph outputs dropped, nodes cut into graph inputs or bypassed, while it still fails
the same way) and saved, with how to reproduce it, as a regression test under tests/engine/fuzz_regressions/
(``--save``).

Usage: python bench/fuzz.py --graphs 10000 --seed 1 [--jobs 2] [--save] [--only INDEX] [--show]
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the project runs from its checkout (it need not be installed)
    sys.path.insert(0, str(REPO))

from bench.pool import Pool  # noqa: E402

REGRESSIONS = REPO / "tests" / "engine" / "fuzz_regressions"
OPSET = 18
FAILURES = frozenset({"crash", "unloadable", "mismatch", "unsettled", "timeout"})
#: Place lists a run is optimized for (the host fallback is appended by the engine).
PLACE_LISTS = ("x86/fp32/nchw", "arm/fp32/nchw", "arm/fp16/nhwc,arm/fp32/nchw", "opencl/fp16/nchw,arm/fp32/nchw",
               "cuda/fp32/nchw", "cuda/fp16/nchw,cuda/fp32/nchw", "npu/int8/nchw,arm/fp32/nchw", "host/fp32/nchw")
#: Verification's rtol; an atol ten times its 1e-5, since a fuzzed graph cancels values near zero (a
#: normalization over equal values divides rounding noise by sqrt(eps)) where a folded or fused form is exact.
RTOL, ATOL = 1e-4, 1e-4
#: With an fp16 place: relative to the element and to the output's largest magnitude (fp16 rounds every op).
FP16_RTOL, FP16_SCALE = 2e-2, 2e-2
FP16_MAX = 65504.0


# --- values and the graph builder ----------------------------------------------------------------------------
@dataclass(frozen=True)
class V:
    name: str
    dtype: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Builder:
    """A graph under construction: values by name with their types, nodes, initializers, inputs."""

    def __init__(self, rng: np.random.Generator):
        import onnx

        self.rng, self.onnx = rng, onnx
        self.values: list[V] = []
        self.nodes: list = []
        self.inputs: list[V] = []
        self.initializers: list = []
        self.counter = 0
        self.produced: list[V] = []

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}{self.counter}"

    def input(self, dtype: int, shape: Sequence[int]) -> V:
        value = V(self.fresh("in"), dtype, tuple(shape))
        self.inputs.append(value)
        self.values.append(value)
        return value

    def const(self, array: np.ndarray, keep: bool = True) -> V:
        array = np.asarray(array)
        dtype = self.onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        value = V(self.fresh("c"), dtype, tuple(array.shape))
        self.initializers.append(self.onnx.numpy_helper.from_array(array, value.name))
        if keep:
            self.values.append(value)
        return value

    def node(self, op: str, inputs: Sequence[V | None], outputs: Sequence[tuple[int, Sequence[int]]], *,
             subgraphs: dict | None = None, **attributes) -> list[V]:
        outs = [V(self.fresh(op.lower()), dtype, tuple(shape)) for dtype, shape in outputs]
        made = self.onnx.helper.make_node(op, [v.name if v is not None else "" for v in inputs],
                                          [v.name for v in outs], name=self.fresh("n"), **attributes)
        for key, graph in (subgraphs or {}).items():
            made.attribute.append(self.onnx.helper.make_attribute(key, graph))
        self.nodes.append(made)
        self.values.extend(outs)
        self.produced.extend(outs)
        return outs

    def pick(self, accept: Callable[[V], bool]) -> V | None:
        """A value that ``accept``s, recent ones likelier (so graphs grow chains, not only fans)."""
        found = [v for v in self.values if accept(v)]
        if not found:
            return None
        weights = np.arange(1, len(found) + 1, dtype=np.float64) ** 2
        return found[int(self.rng.choice(len(found), p=weights / weights.sum()))]

    def model(self, outputs: Sequence[V]):
        helper = self.onnx.helper
        graph = helper.make_graph(
            self.nodes, "fuzz", [helper.make_tensor_value_info(v.name, v.dtype, v.shape) for v in self.inputs],
            [helper.make_tensor_value_info(v.name, v.dtype, v.shape) for v in outputs], self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        return model


def _types():
    from onnx import TensorProto as T

    return T


T = None  # onnx.TensorProto, set on first use (keeps `import bench.fuzz` light)


def _t():
    global T
    if T is None:
        T = _types()
    return T


def is_float(v: V) -> bool:
    return v.dtype in (_t().FLOAT, _t().FLOAT16)


def np_type(dtype: int):
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(dtype)


# --- random pieces -------------------------------------------------------------------------------------------------
def random_shape(rng, rank: int | None = None, empty: float = 0.04) -> tuple[int, ...]:
    rank = int(rng.integers(0, 5)) if rank is None else rank
    return tuple(0 if rng.random() < empty else int(rng.integers(1, 6)) for _ in range(rank))


def random_array(rng, dtype: int, shape: Sequence[int], special: float = 0.05) -> np.ndarray:
    t = _t()
    if dtype in (t.FLOAT, t.FLOAT16, t.DOUBLE):
        data = rng.standard_normal(shape)
        if rng.random() < special:  # NaN, infinities, zeros, large values
            mask = rng.random(shape) < 0.2
            data = np.where(mask, rng.choice([np.nan, np.inf, -np.inf, 0.0, 1e4], size=shape), data)
        return data.astype(np_type(dtype))
    if dtype == t.BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    return np.asarray(rng.integers(-5, 6, shape)).astype(np_type(dtype))


def broadcastable(rng, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape`` to ``shape``: some dims 1, maybe fewer leading dims."""
    out = [d if rng.random() < 0.6 else 1 for d in shape]
    drop = int(rng.integers(0, len(out) + 1)) if out and rng.random() < 0.3 else 0
    return tuple(out[drop:])


# --- op generators: each adds nodes fed by existing values and returns False when none fits ----------------
UNARY_FLOAT = ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Log", "Sqrt", "Floor", "Ceil", "Erf", "Reciprocal",
               "Round", "Sign", "Softplus", "Softsign", "Identity", "HardSigmoid", "LeakyRelu", "Elu", "HardSwish",
               "Sin", "Cos")


def g_unary(b: Builder) -> bool:
    v = b.pick(is_float)
    if v is None:
        return False
    op = str(b.rng.choice(UNARY_FLOAT))
    b.node(op, [v], [(v.dtype, v.shape)])
    return True


def g_clip(b: Builder) -> bool:
    v = b.pick(lambda v: is_float(v) or v.dtype == _t().INT64)
    if v is None:
        return False
    low, high = sorted(b.rng.standard_normal(2) * 2)
    kind = np_type(v.dtype)
    bounds = [b.const(np.array(low, kind), keep=False), b.const(np.array(high, kind), keep=False)]
    if b.rng.random() < 0.3:
        bounds[int(b.rng.integers(0, 2))] = None
    b.node("Clip", [v, *bounds], [(v.dtype, v.shape)])
    return True


def g_cast(b: Builder) -> bool:
    t = _t()
    v = b.pick(lambda v: v.dtype in (t.FLOAT, t.FLOAT16, t.INT64, t.INT32, t.BOOL))
    if v is None:
        return False
    to = int(b.rng.choice([t.FLOAT, t.FLOAT16, t.INT64, t.INT32, t.BOOL, t.DOUBLE]))
    b.node("Cast", [v], [(to, v.shape)], to=to)
    return True


def g_binary(b: Builder) -> bool:
    t = _t()
    v = b.pick(lambda v: v.dtype in (t.FLOAT, t.FLOAT16, t.INT64, t.INT32))
    if v is None:
        return False
    floats = is_float(v)
    ops = ["Add", "Sub", "Mul", "Max", "Min"] + (["Div", "Pow"] if floats else ["Div", "Mod"])
    op = str(b.rng.choice(ops))
    other_shape = broadcastable(b.rng, v.shape)
    if op in ("Div", "Mod") and not floats:  # integer division by zero is an error at run time
        data = b.rng.integers(1, 5, other_shape) * b.rng.choice([-1, 1], other_shape)
        other = b.const(data.astype(np_type(v.dtype)), keep=False)
    else:
        other = b.pick(lambda u: u.dtype == v.dtype and u.shape == other_shape and u is not v)
        if other is None or b.rng.random() < 0.5:
            other = b.const(random_array(b.rng, v.dtype, other_shape))
    if op == "Pow":
        v = b.node("Abs", [v], [(v.dtype, v.shape)])[0]
    inputs = [v, other] if b.rng.random() < 0.7 or op in ("Div", "Mod", "Pow", "Sub") else [other, v]
    attributes = {"fmod": 1} if op == "Mod" and floats else {}
    b.node(op, inputs, [(v.dtype, v.shape)], **attributes)
    return True


def g_compare(b: Builder) -> bool:
    t = _t()
    v = b.pick(lambda v: v.dtype in (t.FLOAT, t.INT64))
    if v is None:
        return False
    other = b.const(random_array(b.rng, v.dtype, broadcastable(b.rng, v.shape)))
    cond = b.node(str(b.rng.choice(["Less", "Greater", "Equal"])), [v, other], [(t.BOOL, v.shape)])[0]
    if b.rng.random() < 0.5:
        another = b.const(random_array(b.rng, t.BOOL, broadcastable(b.rng, v.shape)))
        cond = b.node(str(b.rng.choice(["And", "Or", "Xor"])), [cond, another], [(t.BOOL, v.shape)])[0]
    if b.rng.random() < 0.7:
        alt = b.const(random_array(b.rng, v.dtype, broadcastable(b.rng, v.shape)))
        b.node("Where", [cond, v, alt], [(v.dtype, v.shape)])
    return True


def g_reshape(b: Builder) -> bool:
    v = b.pick(lambda v: 0 < v.size <= 4096)
    if v is None:
        return False
    shape = _factorization(b.rng, v.size)
    spec = list(shape)
    if spec and b.rng.random() < 0.4:
        spec[int(b.rng.integers(0, len(spec)))] = -1
    for axis in range(min(len(spec), len(v.shape))):  # 0 copies the input's dim
        if spec[axis] == v.shape[axis] and b.rng.random() < 0.3:
            spec[axis] = 0
    b.node("Reshape", [v, b.const(np.array(spec, np.int64), keep=False)], [(v.dtype, shape)])
    return True


def _factorization(rng, total: int) -> tuple[int, ...]:
    rank = int(rng.integers(1, 5))
    dims, left = [], total
    for _ in range(rank - 1):
        divisors = [d for d in range(1, left + 1) if left % d == 0]
        d = int(rng.choice(divisors))
        dims.append(d)
        left //= d
    return tuple(dims + [left])


def g_flatten(b: Builder) -> bool:
    v = b.pick(lambda v: len(v.shape) >= 1)
    if v is None:
        return False
    axis = int(b.rng.integers(-len(v.shape), len(v.shape) + 1))
    a = axis + len(v.shape) if axis < 0 else axis
    b.node("Flatten", [v], [(v.dtype, (math.prod(v.shape[:a]), math.prod(v.shape[a:])))], axis=axis)
    return True


def g_transpose(b: Builder) -> bool:
    v = b.pick(lambda v: len(v.shape) >= 2)
    if v is None:
        return False
    perm = [int(p) for p in b.rng.permutation(len(v.shape))]
    out = b.node("Transpose", [v], [(v.dtype, tuple(v.shape[p] for p in perm))], perm=perm)[0]
    if b.rng.random() < 0.4:  # transposes that cancel or compose
        back = [int(p) for p in np.argsort(perm)] if b.rng.random() < 0.5 else \
            [int(p) for p in b.rng.permutation(len(v.shape))]
        b.node("Transpose", [out], [(v.dtype, tuple(out.shape[p] for p in back))], perm=back)
    return True


def g_squeeze(b: Builder) -> bool:
    v = b.pick(lambda v: len(v.shape) <= 4)
    if v is None:
        return False
    if 1 in v.shape and b.rng.random() < 0.5:
        axes = [i for i, d in enumerate(v.shape) if d == 1 and b.rng.random() < 0.7] or [v.shape.index(1)]
        shape = tuple(d for i, d in enumerate(v.shape) if i not in axes)
        b.node("Squeeze", [v, b.const(np.array(axes, np.int64), keep=False)], [(v.dtype, shape)])
        return True
    rank = len(v.shape) + 1
    axis = int(b.rng.integers(-rank, rank))
    shape = list(v.shape)
    shape.insert(axis % rank, 1)
    b.node("Unsqueeze", [v, b.const(np.array([axis], np.int64), keep=False)], [(v.dtype, tuple(shape))])
    return True


def g_concat(b: Builder) -> bool:
    v = b.pick(lambda v: len(v.shape) >= 1)
    if v is None:
        return False
    axis = int(b.rng.integers(0, len(v.shape)))
    others = [u for u in b.values if u.dtype == v.dtype and len(u.shape) == len(v.shape)
              and all(a == c for i, (a, c) in enumerate(zip(u.shape, v.shape)) if i != axis)]
    parts = [v] + [others[int(i)] for i in b.rng.integers(0, len(others), int(b.rng.integers(1, 3)))]
    shape = list(v.shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    b.node("Concat", parts, [(v.dtype, tuple(shape))], axis=axis - len(v.shape) * int(b.rng.random() < 0.3))
    return True


def g_slice(b: Builder) -> bool:
    v = b.pick(lambda v: len(v.shape) >= 1)
    if v is None:
        return False
    axes = sorted({int(a) for a in b.rng.integers(0, len(v.shape), int(b.rng.integers(1, len(v.shape) + 1)))})
    starts, ends, steps, shape = [], [], [], list(v.shape)
    for axis in axes:
        dim = v.shape[axis]
        step = int(b.rng.choice([1, 1, 2, -1, -2]))
        start = int(b.rng.integers(-dim - 2, dim + 3)) if b.rng.random() < 0.8 else int(b.rng.choice([-2**63, 2**63 - 1]))
        end = int(b.rng.integers(-dim - 2, dim + 3)) if b.rng.random() < 0.8 else int(b.rng.choice([-2**63, 2**63 - 1]))
        starts.append(start), ends.append(end), steps.append(step)
        shape[axis] = _slice_length(start, end, step, dim)
    consts = [b.const(np.array(x, np.int64), keep=False) for x in (starts, ends, axes, steps)]
    b.node("Slice", [v, *consts], [(v.dtype, tuple(shape))])
    return True


def _slice_length(start: int, end: int, step: int, dim: int) -> int:
    """Elements ONNX's Slice keeps on one axis (its clamping, written out here apart from the engine's)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return max(0, -(-(start - end) // -step))


def g_gather(b: Builder) -> bool:
    v = b.pick(lambda v: len(v.shape) >= 1)
    if v is None:
        return False
    axis = int(b.rng.integers(0, len(v.shape)))
    dim = v.shape[axis]
    index_shape = random_shape(b.rng, int(b.rng.integers(0, 3)), empty=0.1) if dim else (0,)
    indices = b.rng.integers(-dim, dim, index_shape) if dim else np.zeros(index_shape, np.int64)
    shape = v.shape[:axis] + tuple(index_shape) + v.shape[axis + 1:]
    b.node("Gather", [v, b.const(indices.astype(np.int64), keep=False)], [(v.dtype, shape)], axis=axis)
    return True


def g_expand_tile(b: Builder) -> bool:
    v = b.pick(lambda v: v.size <= 256)
    if v is None:
        return False
    if b.rng.random() < 0.5:
        target = tuple(int(b.rng.integers(1, 4)) if d == 1 else d for d in v.shape)
        target = tuple(int(b.rng.integers(1, 3)) for _ in range(int(b.rng.integers(0, 2)))) + target
        b.node("Expand", [v, b.const(np.array(target, np.int64), keep=False)], [(v.dtype, target)])
    else:
        if not v.shape:
            return False
        repeats = b.rng.integers(0 if b.rng.random() < 0.1 else 1, 3, len(v.shape))
        b.node("Tile", [v, b.const(repeats.astype(np.int64), keep=False)],
               [(v.dtype, tuple(int(d * r) for d, r in zip(v.shape, repeats)))])
    return True


def g_shape_arithmetic(b: Builder) -> bool:
    """Shape -> Gather -> Concat -> Reshape (exporters' dynamic reshapes), or ConstantOfShape(Shape(x))."""
    t = _t()
    v = b.pick(lambda v: len(v.shape) >= 1 and v.size > 0)
    if v is None:
        return False
    shape = b.node("Shape", [v], [(t.INT64, (len(v.shape),))])[0]
    if b.rng.random() < 0.3:
        fill = random_array(b.rng, t.FLOAT, (1,), special=0.0)
        b.node("ConstantOfShape", [shape], [(t.FLOAT, v.shape)],
               value=b.onnx.numpy_helper.from_array(fill.astype(np.float32), "value"))
        return True
    axis = int(b.rng.integers(0, len(v.shape)))
    dim = b.node("Gather", [shape, b.const(np.array([axis], np.int64), keep=False)], [(t.INT64, (1,))])[0]
    rest = b.const(np.array([-1], np.int64), keep=False)
    order = [dim, rest] if b.rng.random() < 0.5 else [rest, dim]
    target = b.node("Concat", order, [(t.INT64, (2,))], axis=0)[0]
    out = (v.shape[axis], v.size // v.shape[axis])
    b.node("Reshape", [v, target], [(v.dtype, out if order[0] is dim else out[::-1])])
    return True


def g_reduce(b: Builder) -> bool:
    t = _t()
    v = b.pick(lambda v: v.dtype in (t.FLOAT, t.FLOAT16, t.INT64) and len(v.shape) >= 1)
    if v is None:
        return False
    ops = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd"]
    if is_float(v):
        ops += ["ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceL1"]
    op = str(b.rng.choice(ops))
    axes = sorted({int(a) for a in b.rng.integers(0, len(v.shape), int(b.rng.integers(1, len(v.shape) + 1)))})
    keep = int(b.rng.integers(0, 2))
    shape = tuple(1 if i in axes else d for i, d in enumerate(v.shape) if keep or i not in axes)
    b.node(op, [v, b.const(np.array(axes, np.int64), keep=False)], [(v.dtype, shape)], keepdims=keep)
    return True


def g_softmax(b: Builder) -> bool:
    v = b.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if v is None:
        return False
    axis = int(b.rng.integers(-len(v.shape), len(v.shape)))
    b.node(str(b.rng.choice(["Softmax", "LogSoftmax"])), [v], [(v.dtype, v.shape)], axis=axis)
    return True


def g_matmul(b: Builder) -> bool:
    t = _t()
    v = b.pick(lambda v: v.dtype == t.FLOAT and len(v.shape) >= 1 and v.shape[-1] > 0)
    if v is None:
        return False
    k, n = v.shape[-1], int(b.rng.integers(1, 6))
    weight = b.const(random_array(b.rng, t.FLOAT, (k, n), special=0.0))
    shape = v.shape[:-1] + (n,)
    if len(v.shape) == 2 and b.rng.random() < 0.4:
        bias = b.const(random_array(b.rng, t.FLOAT, broadcastable(b.rng, shape), special=0.0))
        b.node("Gemm", [v, weight, bias], [(t.FLOAT, shape)], alpha=float(b.rng.choice([1.0, 0.5])),
               beta=float(b.rng.choice([1.0, 2.0])))
        return True
    out = b.node("MatMul", [v, weight], [(t.FLOAT, shape)])[0]
    if b.rng.random() < 0.5:  # a bias, a scale: fc and fold_scale_axis material
        op = str(b.rng.choice(["Add", "Mul", "Div"]))
        data = random_array(b.rng, t.FLOAT, (n,), special=0.02)
        b.node(op, [out, b.const(data)], [(t.FLOAT, shape)])
    return True


def g_layer_norm(b: Builder) -> bool:
    t = _t()
    v = b.pick(lambda v: v.dtype == t.FLOAT and len(v.shape) >= 1 and v.shape[-1] > 0)
    if v is None:
        return False
    d = v.shape[-1]
    scale, bias = (b.const(random_array(b.rng, t.FLOAT, (d,), special=0.0), keep=False) for _ in range(2))
    if b.rng.random() < 0.5:
        b.node("LayerNormalization", [v, scale, bias], [(t.FLOAT, v.shape)], axis=-1, epsilon=1e-5)
        return True
    axes = b.const(np.array([-1], np.int64), keep=False)  # the decomposed form layer_norm_fuse recognises
    mean = b.node("ReduceMean", [v, axes], [(t.FLOAT, v.shape[:-1] + (1,))])[0]
    centered = b.node("Sub", [v, mean], [(t.FLOAT, v.shape)])[0]
    square = b.node("Mul", [centered, centered], [(t.FLOAT, v.shape)])[0]
    var = b.node("ReduceMean", [square, axes], [(t.FLOAT, v.shape[:-1] + (1,))])[0]
    eps = b.const(np.array(1e-5, np.float32), keep=False)
    std = b.node("Sqrt", [b.node("Add", [var, eps], [(t.FLOAT, var.shape)])[0]], [(t.FLOAT, var.shape)])[0]
    normed = b.node("Div", [centered, std], [(t.FLOAT, v.shape)])[0]
    scaled = b.node("Mul", [normed, scale], [(t.FLOAT, v.shape)])[0]
    b.node("Add", [scaled, bias], [(t.FLOAT, v.shape)])
    return True


def g_conv_block(b: Builder) -> bool:
    """Conv (padded, strided, grouped or depthwise), then BN / a per-channel scale / a bias, an activation,
    maybe a pool: the stacks conv_bn_fuse, fold_scale_axis, activation fusions and NHWC kernels work on."""
    t = _t()
    v = b.pick(lambda v: v.dtype == t.FLOAT and len(v.shape) == 4 and min(v.shape) > 0 and min(v.shape[2:]) >= 3)
    if v is None:
        v = b.input(t.FLOAT, (int(b.rng.integers(1, 3)), int(b.rng.integers(1, 5)), int(b.rng.integers(3, 8)),
                              int(b.rng.integers(3, 8))))
    n, c, h, w = v.shape
    group = int(b.rng.choice([g for g in (1, c) if c % g == 0])) if b.rng.random() < 0.3 else 1
    out_c = c if group == c and group > 1 else int(b.rng.integers(1, 6)) * group
    k = int(b.rng.choice([1, 3]))
    pad = int(b.rng.integers(0, 2)) if k == 3 else 0
    stride = int(b.rng.choice([1, 2]))
    weight = b.const(random_array(b.rng, t.FLOAT, (out_c, c // group, k, k), special=0.0))
    inputs = [v, weight] + ([b.const(random_array(b.rng, t.FLOAT, (out_c,), special=0.0))]
                           if b.rng.random() < 0.5 else [])
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    y = b.node("Conv", inputs, [(t.FLOAT, (n, out_c, oh, ow))], kernel_shape=[k, k], pads=[pad] * 4,
               strides=[stride] * 2, group=group)[0]
    roll = b.rng.random()
    if roll < 0.35:
        params = [random_array(b.rng, t.FLOAT, (out_c,), special=0.0) for _ in range(3)]
        var = np.abs(random_array(b.rng, t.FLOAT, (out_c,), special=0.0)) + 0.1
        y = b.node("BatchNormalization", [y, *(b.const(p, keep=False) for p in params), b.const(var, keep=False)],
                   [(t.FLOAT, y.shape)], epsilon=1e-5)[0]
    elif roll < 0.6:
        data = random_array(b.rng, t.FLOAT, (1, out_c, 1, 1), special=0.05)
        y = b.node(str(b.rng.choice(["Mul", "Add", "Div"])), [y, b.const(data, keep=False)], [(t.FLOAT, y.shape)])[0]
    act = str(b.rng.choice(["Relu", "Clip", "HardSwish", "Sigmoid", "LeakyRelu", "None"]))
    if act == "Clip":
        y = b.node("Clip", [y, b.const(np.array(0, np.float32), keep=False), b.const(np.array(6, np.float32),
                                                                                     keep=False)],
                   [(t.FLOAT, y.shape)])[0]
    elif act != "None":
        y = b.node(act, [y], [(t.FLOAT, y.shape)])[0]
    pool = b.rng.random()
    if pool < 0.2 and min(y.shape[2:]) >= 2:
        b.node(str(b.rng.choice(["MaxPool", "AveragePool"])), [y],
               [(t.FLOAT, (n, out_c, y.shape[2] // 2, y.shape[3] // 2))], kernel_shape=[2, 2], strides=[2, 2])
    elif pool < 0.35:
        b.node("GlobalAveragePool", [y], [(t.FLOAT, (n, out_c, 1, 1))])
    return True


def g_if(b: Builder) -> bool:
    """An If over a float value, its condition constant (eliminate_if_with_const_cond folds it) or computed."""
    t = _t()
    helper = b.onnx.helper
    v = b.pick(lambda v: is_float(v))
    if v is None:
        return False
    if b.rng.random() < 0.5:
        cond = b.const(np.array(b.rng.random() < 0.5), keep=False)
    else:
        total = b.node("ReduceSum", [v], [(v.dtype, ())], keepdims=0)[0]
        zero = b.const(np.array(0, np_type(v.dtype)), keep=False)
        cond = b.node("Greater", [total, zero], [(t.BOOL, ())])[0]

    def branch(op: str):
        name = b.fresh("branch_out")
        node = helper.make_node(op, [v.name], [name], name=b.fresh("n"))
        return helper.make_graph([node], b.fresh("body"), [], [helper.make_tensor_value_info(name, v.dtype, v.shape)])

    ops = ["Relu", "Neg", "Abs", "Identity", "Sigmoid"]
    b.node("If", [cond], [(v.dtype, v.shape)], subgraphs={
        "then_branch": branch(str(b.rng.choice(ops))), "else_branch": branch(str(b.rng.choice(ops)))})
    return True


def g_loop(b: Builder) -> bool:
    """A Loop of a constant trip count carrying a float value: x <- x * a + outer."""
    t = _t()
    helper = b.onnx.helper
    v = b.pick(lambda v: v.dtype == t.FLOAT)
    if v is None:
        return False
    trips = b.const(np.array(int(b.rng.integers(0, 4)), np.int64), keep=False)
    keep_going = b.const(np.array(True), keep=False)
    outer = b.const(random_array(b.rng, t.FLOAT, broadcastable(b.rng, v.shape), special=0.0), keep=False)
    i, c_in, x_in = b.fresh("i"), b.fresh("cond"), b.fresh("x")
    c_out, x_out, scaled = b.fresh("cond_out"), b.fresh("x_out"), b.fresh("scaled")
    half = helper.make_tensor(b.fresh("half"), t.FLOAT, [], [0.5])
    body = helper.make_graph(
        [helper.make_node("Identity", [c_in], [c_out], name=b.fresh("n")),
         helper.make_node("Constant", [], [half.name], value=half, name=b.fresh("n")),
         helper.make_node("Mul", [x_in, half.name], [scaled], name=b.fresh("n")),
         helper.make_node("Add", [scaled, outer.name], [x_out], name=b.fresh("n"))],
        b.fresh("loop_body"),
        [helper.make_tensor_value_info(i, t.INT64, []), helper.make_tensor_value_info(c_in, t.BOOL, []),
         helper.make_tensor_value_info(x_in, t.FLOAT, v.shape)],
        [helper.make_tensor_value_info(c_out, t.BOOL, []), helper.make_tensor_value_info(x_out, t.FLOAT, v.shape)])
    b.node("Loop", [trips, keep_going, v], [(t.FLOAT, v.shape)], subgraphs={"body": body})
    return True


def g_constant_chain(b: Builder) -> bool:
    """Ops over constants only: what constant folding and the evaluator compute."""
    t = _t()
    dtype = int(b.rng.choice([t.FLOAT, t.FLOAT, t.INT64, t.FLOAT16]))
    shape = random_shape(b.rng, empty=0.15)
    a = b.const(random_array(b.rng, dtype, shape, special=0.2))
    generators = [g_unary, g_binary, g_reduce, g_cast, g_slice, g_gather, g_reshape, g_transpose, g_squeeze]
    before = len(b.values)
    b.values.append(a)  # make it the likeliest pick
    for _ in range(int(b.rng.integers(1, 4))):
        b.rng.choice(generators)(b)
    return len(b.values) > before


GENERATORS: list[tuple[Callable[[Builder], bool], float]] = [
    (g_unary, 3), (g_clip, 1), (g_cast, 1), (g_binary, 4), (g_compare, 1), (g_reshape, 2), (g_flatten, 0.5),
    (g_transpose, 1.5), (g_squeeze, 1), (g_concat, 1), (g_slice, 1.5), (g_gather, 1), (g_expand_tile, 1),
    (g_shape_arithmetic, 1), (g_reduce, 1.5), (g_softmax, 1), (g_matmul, 2), (g_layer_norm, 0.7),
    (g_conv_block, 2), (g_if, 0.5), (g_loop, 0.4), (g_constant_chain, 1.5),
]


def generate(seed: int, index: int):
    """Graph ``index`` of run ``seed``: inputs, 3 to 14 generator steps, 1 to 3 outputs."""
    t = _t()
    rng = np.random.default_rng([seed, index])
    b = Builder(rng)
    for _ in range(int(rng.integers(1, 3))):
        dtype = int(rng.choice([t.FLOAT, t.FLOAT, t.FLOAT, t.INT64, t.FLOAT16, t.BOOL]))
        b.input(dtype, random_shape(rng))
    if rng.random() < 0.4:
        b.input(t.FLOAT, (int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(3, 8)),
                          int(rng.integers(3, 8))))
    functions, weights = zip(*GENERATORS)
    p = np.array(weights) / sum(weights)
    for _ in range(int(rng.integers(3, 15))):
        for _attempt in range(4):
            if functions[int(rng.choice(len(functions), p=p))](b):
                break
    if not b.produced:
        g_unary(b) or g_binary(b) or g_reshape(b)
    produced = b.produced or [b.node("Identity", [b.values[0]], [(b.values[0].dtype, b.values[0].shape)])[0]]
    outputs = {produced[-1].name: produced[-1]}
    for _ in range(int(rng.integers(0, 3))):
        pick = produced[int(rng.integers(0, len(produced)))]
        outputs[pick.name] = pick
    return b.model(list(outputs.values()))


def draw_options(seed: int, index: int) -> dict:
    rng = np.random.default_rng([seed, index, 1])
    return {"places": str(rng.choice(PLACE_LISTS)), "opt_level": int(rng.integers(0, 3)),
            "portable": bool(rng.random() < 0.25)}


# --- the check ----------------------------------------------------------------------------------------------------
@dataclass
class Result:
    seed: int
    index: int
    outcome: str
    detail: str = ""
    options: dict = field(default_factory=dict)
    seconds: float = 0.0
    nodes: int = 0

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


def _session(model_bytes_or_path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes_or_path, options, providers=["CPUExecutionProvider"])


def feeds_for(model, seed: int) -> dict[str, np.ndarray]:
    initializers = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng([seed, 7])
    feeds = {}
    for item in model.graph.input:
        if item.name in initializers:
            continue
        tensor = item.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        feeds[item.name] = random_array(rng, tensor.elem_type, shape, special=0.0)
    return feeds


def check(model, options: dict, workdir: Path, seed: int = 0) -> tuple[str, str]:
    """(outcome, detail) of optimizing ``model`` with ``options`` and comparing it with the input."""
    from bench.conformance import _short, is_internal
    from worker.engine.api import optimize
    from worker.engine.options import OptimizeOptions

    from worker.engine.numeric import _stored_in_fp16

    try:  # fp16 values stored in fp16 on both sides, as the engine's verification runs them
        expected = _session(_stored_in_fp16(model.SerializeToString())).run(None, feeds_for(model, seed))
    except Exception as exc:
        return "invalid", _short(f"onnxruntime cannot run the generated graph: {exc}")
    source, target = workdir / "in.onnx", workdir / "out.onnx"
    import onnx

    onnx.save(model, source)
    half = "fp16" in options["places"]
    try:
        # With an fp16 place, as a user runs it: verified, so auto mixed precision keeps in fp32 what fp16
        # cannot compute; a model it cannot make verify is a mismatch, never a refusal.
        report = optimize(source, target, OptimizeOptions(verify=half, **options))
    except Exception as exc:  # noqa: BLE001 - every exception is classified
        if half and _does_not_verify(exc):
            return "mismatch", _short(f"verification: {exc}", 500)
        if is_internal(exc):
            frames = traceback.extract_tb((exc.__cause__ or exc).__traceback__)
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            cause = f" [{type(exc.__cause__).__name__}{where}]" if exc.__cause__ else where
            return "crash", _short(f"{type(exc).__name__}: {exc}{cause}", 500)
        return "refused", _short(str(exc))
    try:
        session = _session(_stored_in_fp16(str(target)))
    except Exception as exc:
        return "unloadable", _short(exc)
    feeds = feeds_for(model, seed)
    try:
        actual = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    except Exception as exc:
        return "mismatch", _short(f"onnxruntime cannot run the output: {exc}")
    in_fp16 = _session(_fp16_everywhere(model)).run(None, feeds) if half else [None] * len(expected)
    in_fp32 = _run_in_fp32(model, feeds) if not half else [None] * len(expected)
    widened = _widened_fp16(model)
    for k, (e, a, h, w) in enumerate(zip(expected, actual, in_fp16, in_fp32)):
        why = compare(np.asarray(e), np.asarray(a), half, None if h is None else np.asarray(h),
                      None if w is None else np.asarray(w), fp16_values=model.graph.output[k].name in widened)
        if why:
            return "mismatch", f"output {k} ({model.graph.output[k].name}): {why}"
    unsettled = [w["message"] for w in report.get("warnings") or [] if w.get("kind") == "not_converged"]
    if unsettled:  # a fixed point stopped at its cap: rewrites undoing each other (or one that never ends)
        return "unsettled", _short(unsettled[0])
    return "ok", ""


def _widened_fp16(model) -> set[str]:
    """Outputs that widen an fp16 value by Cast / Identity through float and double only (fp16 -> float ->
    double): the input model holds fp16 values there, so the optimized one must too. Computing the fp16 values
    in fp32 (fp32 places) is allowed, within what that moves them; skipping the model's rounding to fp16 where
    they leave their type is not: an integer Cast or a comparison would then see digits the model never had."""
    import onnx
    from onnx import TensorProto

    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - without types, none is known to be fp16
        return set()
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)
             if v.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in graph.initializer})
    producers = {name: node for node in graph.node for name in node.output}
    wider = (TensorProto.FLOAT, TensorProto.DOUBLE)
    found = set()
    for output in graph.output:
        name = output.name
        while (types.get(name) in wider and name in producers and producers[name].input
               and producers[name].op_type in ("Cast", "Identity") and producers[name].domain in ("", "ai.onnx")):
            name = producers[name].input[0]
            if types.get(name) == TensorProto.FLOAT16:
                found.add(output.name)
    return found


def _does_not_verify(exc: BaseException) -> bool:
    from worker.engine.errors import VerificationError

    return isinstance(exc, VerificationError) and "does not compute what the input computed" in str(exc)


def _fp16_everywhere(model) -> bytes:
    """The input model with every float value (inputs and what each node computes) stored in fp16: the same
    computation as the input, done as an fp16 device would store it. How far its outputs are from the fp32
    ones is how far fp16 itself moves them (a comparison that flips, a cancellation), whatever the engine does."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.shape_inference.infer_shapes(model)
    graph = model.graph
    floats = {v.name for v in (*graph.value_info, *graph.input, *graph.output)
              if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == TensorProto.FLOAT}
    initializers = {t.name for t in graph.initializer}
    nodes, renamed = [], {}

    def rounded(name: str) -> list:
        low, back = f"{name}__fp16", f"{name}__rounded"
        renamed[name] = back
        return [helper.make_node("Cast", [name], [low], to=TensorProto.FLOAT16),
                helper.make_node("Cast", [low], [back], to=TensorProto.FLOAT)]

    for value in graph.input:
        if value.name in floats and value.name not in initializers:
            nodes += rounded(value.name)
    for node in graph.node:
        for slot, name in enumerate(node.input):
            node.input[slot] = renamed.get(name, name)
        nodes.append(node)
        for name in node.output:
            if name in floats:
                nodes += rounded(name)
    del graph.node[:]
    graph.node.extend(nodes)
    for output in graph.output:  # the outputs leave rounded too
        if output.name in renamed:
            graph.node.append(helper.make_node("Identity", [renamed[output.name]], [output.name + "__out"]))
            output.name = output.name + "__out"
    return model.SerializeToString()


def _fp32_everywhere(model) -> bytes | None:
    """The input model with every fp16 value, constant and Cast to fp16 made fp32 (subgraphs too), or None when
    it has none: the same computation done in fp32, as fp32 places run an fp16 model (kernel pick takes its
    fp16 values through a calib into fp32 kernels, and a Cast back to fp32 then converts nothing). How far
    its outputs are from the fp16 ones is how far fp16 itself moves them; the mirror of _fp16_everywhere."""
    import onnx
    from onnx import TensorProto, numpy_helper

    half, single = TensorProto.FLOAT16, TensorProto.FLOAT
    model = onnx.shape_inference.infer_shapes(model)
    changed = [False]

    def tensor(t) -> None:
        if t.data_type == half:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
            changed[0] = True

    def value(v) -> None:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == half:
            v.type.tensor_type.elem_type = single
            changed[0] = True

    def graph(g) -> None:
        for v in (*g.input, *g.output, *g.value_info):
            value(v)
        for t in g.initializer:
            tensor(t)
        for node in g.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i == half:
                    attr.i, changed[0] = single, True
                if attr.HasField("t"):
                    tensor(attr.t)
                for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    graph(body)

    graph(model.graph)
    return model.SerializeToString() if changed[0] else None


def _run_in_fp32(model, feeds: dict) -> list:
    """The outputs of the input model computed in fp32 (``_fp32_everywhere``), or Nones when it holds no fp16
    or that model does not run (then nothing is allowed beyond rtol / atol)."""
    nones = [None] * len(model.graph.output)
    try:
        widened = _fp32_everywhere(model)
        if widened is None:
            return nones
        session = _session(widened)
        wanted = {i.name for i in session.get_inputs()}
        return session.run(None, {k: v.astype(np.float32) if v.dtype == np.float16 else v
                                  for k, v in feeds.items() if k in wanted})
    except Exception:  # noqa: BLE001 - no fp32 reference: the plain comparison
        return nones


def compare(expected: np.ndarray, actual: np.ndarray, half: bool, in_fp16: np.ndarray | None = None,
            in_fp32: np.ndarray | None = None, *, fp16_values: bool = False) -> str | None:
    """Whether ``actual`` is ``expected``, within rtol / atol; with an fp16 place (``half``), within fp16's
    rounding at the element's and the output's magnitude, and, where ``in_fp16`` (the input model computed
    with its values stored in fp16) is given, within twice what fp16 itself moved each element. Without an
    fp16 place, where ``in_fp32`` (an input model that computes in fp16, computed in fp32) is given, also
    within twice what computing in fp32 moved each element: fp32 places compute the model's fp16 values in
    fp32, which rounds them less, not differently in kind. With ``fp16_values`` (the output widens an fp16
    value by Cast: the input holds fp16 values there) every float of ``actual`` must be an fp16 value too:
    one that is not lost the model's rounding to fp16."""
    if expected.dtype != actual.dtype:
        return f"element type {actual.dtype} instead of {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {list(actual.shape)} instead of {list(expected.shape)}"
    if fp16_values and actual.dtype.kind == "f" and actual.size:
        a = actual.astype(np.float64).reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            lost = np.isfinite(a) & (a.astype(np.float16).astype(np.float64) != a)
        if lost.any():
            first = int(np.flatnonzero(lost)[0])
            return (f"{int(lost.sum())} of {a.size} elements are not fp16 values, although the output widens "
                    f"an fp16 value (first at {first}: {a[first]!r})")
    if expected.size == 0 or expected.dtype.kind not in "fiub":
        return None if np.array_equal(expected, actual) else "values differ"
    if half and expected.dtype.kind in "iu":  # integers cast from fp16 values: one either side, or fp16's error
        e, a = expected.astype(np.float64), actual.astype(np.float64)
        close = np.abs(e - a) <= 1 + FP16_RTOL * np.abs(e)
        return None if bool(np.all(close)) else f"{int(np.sum(~close))} of {e.size} integers differ"
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (e == a) | (np.isnan(e) & np.isnan(a))
        if half or expected.dtype == np.float16:
            finite = np.isfinite(e)
            representable = finite & (np.abs(e) <= FP16_MAX / 2)
            scale = float(np.max(np.abs(e[representable]))) if representable.any() else 0.0
            allowed = FP16_RTOL * np.abs(e) + ATOL + FP16_SCALE * scale
            if in_fp16 is not None and in_fp16.shape == e.shape:
                moved = np.abs(in_fp16.astype(np.float64) - e)
                allowed = allowed + 2 * np.where(np.isnan(moved), 0.0, moved)
            # beyond fp16's range, or NaN / inf where fp16 overflowed on the way: fp16's, not a bug
            out_of_range = ~finite | (np.abs(e) > FP16_MAX / 2) | (~np.isfinite(a) & finite)
            close = same | (np.abs(e - a) <= allowed) | (out_of_range if half else False)
        else:
            close = same | (np.abs(e - a) <= RTOL * np.abs(e) + ATOL)
            if in_fp32 is not None and in_fp32.shape == e.shape:
                w = in_fp32.astype(np.float64)
                moved = np.abs(w - e)
                finite = np.isfinite(moved)
                # where fp16 overflowed (or made a NaN) and fp32 did not, the fp32 result itself is expected
                as_fp32 = (w == a) | (np.abs(w - a) <= RTOL * np.abs(w) + ATOL)
                close |= np.where(finite, np.abs(e - a) <= RTOL * np.abs(e) + ATOL + 2 * np.where(finite, moved, 0),
                                  as_fp32)
    if bool(np.all(close)):
        return None
    bad = np.flatnonzero(~close.reshape(-1))
    return (f"{bad.size} of {e.size} elements differ (first at {bad[0]}: {a.reshape(-1)[bad[0]]!r} instead of "
            f"{e.reshape(-1)[bad[0]]!r})")


def run_one(seed: int, index: int) -> Result:
    started = time.perf_counter()
    options = draw_options(seed, index)
    result = Result(seed, index, "", options=options)
    try:
        model = generate(seed, index)
        result.nodes = len(model.graph.node)
        with tempfile.TemporaryDirectory(prefix="mirserve-fuzz-") as workdir:
            result.outcome, result.detail = check(model, options, Path(workdir), seed)
    except Exception as exc:  # noqa: BLE001 - a bug of this harness: its own outcome
        result.outcome, result.detail = "invalid", f"harness: {type(exc).__name__}: {exc}"
    result.seconds = round(time.perf_counter() - started, 3)
    return result


# --- shrinking -----------------------------------------------------------------------------------------------------
def shrink(model, options: dict, outcome: str, seed: int, budget: int = 400):
    """A smallest model that still ends as ``outcome`` (graph outputs dropped, nodes cut into graph inputs of
    their output's type, nodes bypassed), trying each candidate until none helps or ``budget`` runs out."""
    import onnx

    def fails(candidate) -> bool:
        nonlocal budget
        budget -= 1
        try:
            onnx.checker.check_model(candidate, full_check=True)
        except Exception:
            return False
        with tempfile.TemporaryDirectory(prefix="mirserve-shrink-") as workdir:
            return check(candidate, options, Path(workdir), seed)[0] == outcome

    improved = True
    while improved and budget > 0:
        improved = False
        for candidate in _smaller(model):
            if budget <= 0:
                break
            if fails(candidate):
                model, improved = candidate, True
                break
    return model


def _smaller(model):
    """Candidate models, each a little smaller than ``model``."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)
             + list(inferred.graph.input)}
    graph = model.graph
    if len(graph.output) > 1:
        for k in range(len(graph.output)):
            yield _pruned(model, outputs=[o for i, o in enumerate(graph.output) if i != k])
    for k in reversed(range(len(graph.node))):
        node = graph.node[k]
        used = [o for o in node.output if o]
        if used and all(o in types and types[o].HasField("tensor_type") for o in used):
            new_inputs = [onnx.helper.make_value_info(o, types[o]) for o in used]
            yield _pruned(model, drop=k, extra_inputs=new_inputs)
        for i in node.input:
            if i and len(used) == 1 and i in types and types[i] == types.get(used[0]):
                yield _pruned(model, drop=k, rename={used[0]: i})
                break


def _pruned(model, *, outputs=None, drop: int | None = None, extra_inputs=(), rename: dict | None = None):
    """``model`` with node ``drop`` removed, readers renamed, and everything no output needs removed."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    rename = rename or {}
    if outputs is not None:
        del graph.output[:]
        graph.output.extend(outputs)
    if drop is not None:
        del graph.node[drop]
    for node in _all_nodes(graph):
        node.input[:] = [rename.get(i, i) for i in node.input]
    for output in graph.output:
        if output.name in rename:  # a graph output keeps its name: an Identity carries it
            graph.node.append(onnx.helper.make_node("Identity", [rename[output.name]], [output.name]))
    graph.input.extend(extra_inputs)
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(_reads(node))
    del graph.node[:]
    graph.node.extend(reversed(kept))
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    inputs = [i for i in graph.input if i.name in needed]
    del graph.input[:]
    graph.input.extend(inputs)
    return out


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _all_nodes(body)


def _reads(node) -> set[str]:
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in _all_nodes(body):
                names.update(i for i in inner.input if i)
    return names


def save_regression(model, result: Result, directory: Path = REGRESSIONS) -> Path:
    """The shrunk model and how to reproduce it, as a case tests/engine/test_fuzz.py runs."""
    import onnx

    directory.mkdir(parents=True, exist_ok=True)
    data = model.SerializeToString()
    stem = f"{result.outcome}-{hashlib.sha256(data).hexdigest()[:10]}"
    (directory / f"{stem}.onnx").write_bytes(data)
    (directory / f"{stem}.json").write_text(json.dumps(
        {"options": result.options, "outcome": result.outcome, "detail": result.detail,
         "found_by": f"python bench/fuzz.py --seed {result.seed} --only {result.index}",
         "graph": onnx.printer.to_text(model.graph)}, indent=1) + "\n")
    return directory / f"{stem}.onnx"


def check_saved(path: Path) -> tuple[str, str]:
    """Run a saved regression case: its model, with its options."""
    import onnx

    options = json.loads(path.with_suffix(".json").read_text())["options"]
    with tempfile.TemporaryDirectory(prefix="mirserve-fuzz-") as workdir:
        return check(onnx.load(path), options, Path(workdir))


# --- the command -----------------------------------------------------------------------------------------------
_SEED = [0]


def _task(index: int) -> dict:
    return asdict(run_one(_SEED[0], index))


def _failed(index: int, kind: str, detail: str) -> dict:
    return asdict(Result(_SEED[0], index, kind, detail, options=draw_options(_SEED[0], index)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=1000, help="graphs to generate (default: 1000)")
    parser.add_argument("--seed", type=int, default=1, help="run seed (default: 1)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one graph may take")
    parser.add_argument("--only", type=int, action="append", help="run only graph INDEX (repeatable)")
    parser.add_argument("--save", action="store_true", help="shrink each failure and save it as a regression test")
    parser.add_argument("--show", action="store_true", help="print each --only graph as onnx text")
    args = parser.parse_args(argv)
    _SEED[0] = args.seed
    indices = args.only or list(range(args.graphs))
    if args.show:
        import onnx

        for index in indices:
            print(f"# graph {index} of seed {args.seed}, options {draw_options(args.seed, index)}")
            print(onnx.printer.to_text(generate(args.seed, index).graph))
    started = time.perf_counter()
    results: list[Result] = []
    with Pool(_task, _failed, args.jobs, args.timeout) as pool:
        for answer in pool.map(indices):
            results.append(Result(**answer))
            if len(results) % 500 == 0:
                print(f"  {len(results)} of {len(indices)}: {sum(r.failed for r in results)} failures", flush=True)
    elapsed = time.perf_counter() - started
    failures = sorted((r for r in results if r.failed), key=lambda r: r.index)
    for result in failures:
        print(f"FAIL graph {result.index} ({result.options}): {result.outcome}: {result.detail}")
        if args.save and result.outcome != "timeout":
            model = shrink(generate(args.seed, result.index), result.options, result.outcome, args.seed)
            print(f"  shrunk to {len(model.graph.node)} nodes: {save_regression(model, result)}")
    counts = collections.Counter(r.outcome for r in results)
    refusals = collections.Counter(r.detail[:120] for r in results if r.outcome == "refused")
    for reason, count in refusals.most_common(5):
        print(f"  refused {count}x: {reason}")
    nodes = sum(r.nodes for r in results)
    print(f"{len(results)} graphs ({nodes} nodes) of seed {args.seed} in {elapsed:.0f} s "
          f"({1000 * elapsed / max(len(results), 1):.0f} ms per graph with {args.jobs} processes, "
          f"{1000 * sum(r.seconds for r in results) / max(len(results), 1):.0f} ms of work each): "
          + ", ".join(f"{counts[k]} {k}" for k in ("ok", "refused", "invalid", "crash", "unloadable", "mismatch",
                                                    "unsettled", "timeout")))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
