"""Evaluate one node on known inputs: numpy kernels for the common ops, then onnxruntime (when asked, as
constant folding and type inference do) and ``onnx.reference`` for the rest.

Used by type inference to learn the values of shape subgraphs, and by constant folding. Callers decide what
is worth evaluating (sizes, determinism, Q/DQ); this module only computes, and returns None when it cannot.
A value computed here replaces what the runtime computes, so it must be the runtime's value: a numpy kernel
declines (None) where numpy and onnxruntime part ways (empty reductions, NaN in max/min, integer sums that
may overflow, fp16 accumulation, casts of strings and of types numpy lacks), nothing is computed for an op
on types its schema does not allow, and an input that is an error at run time (an integer division by zero,
INT_MIN / -1, which kills onnxruntime) is computed by nobody (``Undefined``).
ConstantOfShape and Expand of known values return read-only broadcast views: a folded weight filled with one
value then takes no memory until the writer streams it.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import helper

from worker.engine.ir import Node
from worker.engine.runtime import cpu_session, session_options

#: Ops whose result is not a function of their inputs: never evaluated.
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli", "Dropout_training"})

Kernel = Callable[[Node, list, int], "list[np.ndarray] | None"]
_KERNELS: dict[str, Kernel] = {}


class Undefined(Exception):
    """Raised by a kernel when the result is an error at run time (an integer division by zero) or crashes
    the runtime (INT_MIN / -1 kills the process with SIGFPE): nobody is asked to compute it, not even
    onnxruntime; the value stays unknown and the node stays in the model for the runtime to report."""


def kernel(*op_types: str):
    def register(fn: Kernel) -> Kernel:
        for op in op_types:
            _KERNELS[op] = fn
        return fn
    return register


def evaluate(node: Node, inputs: Sequence[np.ndarray | None], opset: int, *,
             runtime: bool = False) -> list[np.ndarray] | None:
    """Outputs of ``node`` for these input arrays (None for an omitted optional input), or None.

    With ``runtime``, an op without a numpy kernel runs on onnxruntime (what the optimized model will be
    checked against) before falling back to ``onnx.reference``.
    """
    if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC or node.subgraphs():
        return None
    if not _schema_accepts(node.op_type, opset, tuple(None if x is None else np.asarray(x).dtype for x in inputs)):
        return None  # the op is not defined on these types: the runtime refuses the model, folding must not
    fn = _KERNELS.get(node.op_type)
    try:
        if fn is not None:
            with np.errstate(all="ignore"):  # inf and NaN are values like any other here
                outputs = fn(node, list(inputs), opset)
            if outputs is not None:
                return [np.asarray(o) for o in outputs]
    except Undefined:
        return None
    except Exception:  # an input the op rejects: leave the value unknown, the runtime will complain
        return None
    if runtime:
        outputs = _onnxruntime(node, inputs, opset)
        if outputs is not None:
            return outputs
    try:
        return _reference(node, inputs, opset)
    except Exception:
        return None


@functools.lru_cache(maxsize=4096)
def _schema_accepts(op_type: str, opset: int, dtypes: tuple) -> bool:
    """The op's schema at this opset allows these input element types (an unknown op or type: True)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return True
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formal = list(schema.inputs)
    for k, dtype in enumerate(dtypes):
        if dtype is None or not formal:
            continue
        spec = formal[min(k, len(formal) - 1)].type_str
        name = _type_string(dtype)
        if name is not None and name not in allowed.get(spec, {spec}):
            return False
    return True


def _type_string(dtype: np.dtype) -> str | None:
    """numpy dtype -> a schema's type string ("tensor(float)"); None for a dtype onnx does not name."""
    try:
        text = helper.tensor_dtype_to_string(helper.np_dtype_to_tensor_dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return None
    return f"tensor({text.rpartition('.')[2].lower()})"


def _node_proto(node: Node, inputs: Sequence[np.ndarray | None]):
    from worker.engine.ir.serde import encode_attribute

    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    proto = helper.make_node(node.op_type, names, [f"o{k}" for k in range(len(node.outputs))])
    proto.attribute.extend(encode_attribute(a) for a in node.attributes.values())
    return proto


def _onnxruntime(node: Node, inputs: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """Run the node as a one-node model on onnxruntime's CPU provider, as onnxsim folds."""
    model = _one_node_model(_node_proto(node, inputs), inputs, opset,
                            [value.dtype for value in node.outputs])
    return _run_on_onnxruntime(model, {f"i{k}": _contiguous(x) for k, x in enumerate(inputs) if x is not None})


def _contiguous(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy or view of the same shape (``np.ascontiguousarray`` makes a 0-d array 1-d)."""
    return np.ascontiguousarray(array).reshape(np.shape(array))


def _run_on_onnxruntime(model, feeds: dict) -> list[np.ndarray] | None:
    """All outputs of ``model`` on onnxruntime's CPU provider, unoptimized; None when it refuses."""
    try:
        session = cpu_session(model.SerializeToString(), session_options(threads=1, log_severity=4))
        return [np.asarray(o) for o in session.run(None, feeds)]
    except Exception:  # onnxruntime lacks a kernel or rejects the inputs
        return None


def evaluate_on_onnxruntime(batch: Sequence[tuple[Node, Sequence[np.ndarray | None]]],
                            opset: int) -> list[list[np.ndarray] | None]:
    """Outputs of every node of ``batch`` on its inputs, all in one onnxruntime session (a session per
    node costs more than the computing on a model with a hundred quantized weights); a node the batch
    could not run is tried alone. Each entry is like ``evaluate(..., runtime=True)``'s answer."""
    protos, graph_inputs, graph_outputs, feeds = [], [], [], {}
    for index, (node, inputs) in enumerate(batch):
        proto = _node_proto(node, inputs)
        renamed = {name: f"n{index}_{name}" for name in [*proto.input, *proto.output] if name}
        proto.input[:] = [renamed.get(name, "") for name in proto.input]
        proto.output[:] = [renamed[name] for name in proto.output]
        protos.append(proto)
        for k, x in enumerate(inputs):
            if x is not None:
                name = f"n{index}_i{k}"
                feeds[name] = _contiguous(x)
                graph_inputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
        graph_outputs += [helper.make_tensor_value_info(name, value.dtype, None) if value.dtype
                          else helper.make_empty_tensor_value_info(name)
                          for name, value in zip(proto.output, node.outputs)]
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(helper.make_graph(protos, "eval", graph_inputs, graph_outputs),
                              opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    flat = _run_on_onnxruntime(model, feeds)
    if flat is None:  # a node onnxruntime rejects: each on its own
        return [evaluate(node, inputs, opset, runtime=True) for node, inputs in batch]
    answers, start = [], 0
    for node, _ in batch:
        answers.append(flat[start:start + len(node.outputs)])
        start += len(node.outputs)
    return answers


def _reference(node: Node, inputs: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(_one_node_model(_node_proto(node, inputs), inputs, opset))
    feeds = {f"i{k}": x for k, x in enumerate(inputs) if x is not None}
    return [np.asarray(o) for o in evaluator.run(None, feeds)]


def _one_node_model(proto, inputs, opset: int, output_dtypes: Sequence[int] = ()):
    graph_inputs = [helper.make_tensor_value_info(f"i{k}", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                    for k, x in enumerate(inputs) if x is not None]
    graph_outputs = [helper.make_tensor_value_info(name, output_dtypes[k], None)
                     if k < len(output_dtypes) and output_dtypes[k] else helper.make_empty_tensor_value_info(name)
                     for k, name in enumerate(proto.output)]
    graph = helper.make_graph([proto], "eval", graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def _axes(node: Node, inputs: list, opset: int, since: int, slot: int = 1) -> list[int] | None:
    """Axes of Squeeze/Unsqueeze/Reduce*: an attribute before opset ``since``, an input from it on."""
    if opset >= since:
        value = inputs[slot] if len(inputs) > slot else None
        return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else list(axes)


@kernel("Constant")
def _constant(node, x, opset):
    value = node.constant_output()
    return None if value is None else [value]


@kernel("Identity")
def _identity(node, x, opset):
    return [x[0]]


@kernel("Shape")
def _shape(node, x, opset):
    dims = np.array(x[0].shape, dtype=np.int64)
    start, end = node.attr("start", 0), node.attr("end")
    return [dims[start:end]]


@kernel("Size")
def _size(node, x, opset):
    return [np.array(x[0].size, dtype=np.int64)]


@kernel("Gather")
def _gather(node, x, opset):
    return [np.take(x[0], x[1].astype(np.int64), axis=node.attr("axis", 0))]


@kernel("Unsqueeze")
def _unsqueeze(node, x, opset):
    axes = _axes(node, x, opset, 13)
    out_rank = x[0].ndim + len(axes)
    result = x[0]
    for axis in sorted(a % out_rank for a in axes):
        result = np.expand_dims(result, axis)
    return [result]


@kernel("Squeeze")
def _squeeze(node, x, opset):
    axes = _axes(node, x, opset, 13)
    if axes is None:
        return [np.squeeze(x[0])]
    return [np.squeeze(x[0], axis=tuple(a % x[0].ndim for a in axes))]


@kernel("Concat")
def _concat(node, x, opset):
    return [np.concatenate([a for a in x if a is not None], axis=node.attr("axis"))]


@kernel("Slice")
def _slice(node, x, opset):
    data = x[0]
    if opset < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        starts, ends = x[1], x[2]
        axes = x[3] if len(x) > 3 else None
        steps = x[4] if len(x) > 4 else None
    starts = [int(s) for s in np.reshape(starts, -1)]
    ends = [int(e) for e in np.reshape(ends, -1)]
    axes = list(range(len(starts))) if axes is None else [int(a) % data.ndim for a in np.reshape(axes, -1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.reshape(steps, -1)]
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            return None
        first, stop = slice_bounds(start, end, step, data.shape[axis])
        index[axis] = slice(first, stop if stop >= 0 else None, step)  # stop -1: "before 0", not "the last"
    return [data[tuple(index)]]


#: Ends that onnxruntime reads as "past the first element" when the step is negative (the largest int64 and
#: int32: exporters write either for "to the end", whichever the direction).
_OPEN_ENDS = frozenset({2**63 - 1, 2**31 - 1})


def slice_bounds(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX's clamping of one axis's start and end as onnxruntime does it (Python's differs: a start before the
    first element with a negative step is -1 there, an empty slice, and 0 in ONNX, the first element; and an
    end of INT64_MAX or INT32_MAX with a negative step runs to the first element in onnxruntime, where the
    spec's clamp would give an empty slice)."""
    if step < 0 and end in _OPEN_ENDS:
        end = -1 - dim
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


#: Element types numpy computes like onnxruntime does; the others (bfloat16, float8, 4-bit and 2-bit ints)
#: numpy knows only through ml_dtypes, whose rounding and saturation are not the runtime's.
NUMPY_TYPES = frozenset(np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                              np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                              np.float64))


def _numpy_type(dtype) -> bool:
    try:
        return np.dtype(dtype) in NUMPY_TYPES
    except TypeError:
        return False


@kernel("Cast")
def _cast(node, x, opset):
    """Casts between numpy's types; from bfloat16, float8 and small ints to float32/64 (exact widenings).
    Anything else is the runtime's alone: strings (formatted and parsed its own way) and casts to types
    numpy lacks (rounding, saturation): Undefined, so not even the reference evaluator guesses."""
    source, target = x[0].dtype, np.dtype(helper.tensor_dtype_to_np_dtype(node.attr("to")))
    if _numpy_type(source) and _numpy_type(target):
        return [x[0].astype(target)]
    if source.kind == "V" and target in (np.dtype(np.float32), np.dtype(np.float64)):
        return [x[0].astype(target)]
    raise Undefined(f"a cast from {source} to {target} is the runtime's to compute")


def _int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero, as ONNX runtimes do (numpy's // floors)."""
    _check_divisor(a, b)
    quotient = np.abs(a) // np.abs(b)
    return (np.sign(a) * np.sign(b) * quotient).astype(np.result_type(a, b))


def _check_divisor(a: np.ndarray, b: np.ndarray) -> None:
    """Integer division by zero is an error at run time, and the most negative value divided by -1 overflows
    (onnxruntime dies of SIGFPE): raise Undefined for either."""
    if not b.size or not np.issubdtype(b.dtype, np.integer):
        return
    if not np.all(b):
        raise Undefined("integer division by zero")
    if np.issubdtype(a.dtype, np.signedinteger) and np.issubdtype(b.dtype, np.signedinteger) \
            and np.any(np.broadcast_to(b == -1, np.broadcast_shapes(a.shape, b.shape))
                       & (a == np.iinfo(np.result_type(a, b)).min)):
        raise Undefined("integer division overflows")


_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal, "Less": np.less,
           "Greater": np.greater, "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
           "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}


@kernel(*_BINARY)
def _binary(node, x, opset):
    result = _BINARY[node.op_type](x[0], x[1])
    return [result if result.dtype == np.bool_ else result.astype(np.result_type(x[0], x[1]))]


@kernel("Div")
def _div(node, x, opset):
    a, b = x
    if np.issubdtype(a.dtype, np.integer):
        return [_int_divide(a, b)]
    return [(a / b).astype(a.dtype)]


@kernel("Max", "Min")
def _max_min(node, x, opset):
    fn = np.maximum if node.op_type == "Max" else np.minimum
    result = x[0]
    for other in x[1:]:
        result = fn(result, other)
    return [result]


_UNARY = {"Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Floor": np.floor, "Ceil": np.ceil,
          "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Exp": np.exp, "Log": np.log}


@kernel(*_UNARY)
def _unary(node, x, opset):
    return [_UNARY[node.op_type](x[0]).astype(x[0].dtype)]


@kernel("Where")
def _where(node, x, opset):
    return [np.where(x[0], x[1], x[2])]


@kernel("Range")
def _range(node, x, opset):
    start, limit, delta = (np.asarray(v).reshape(()) for v in x)
    if not np.issubdtype(start.dtype, np.integer):
        return None  # runtimes add delta step by step in the element type; numpy multiplies: other roundings
    return [np.arange(start, limit, delta, dtype=np.result_type(start, limit, delta))]


@kernel("Expand")
def _expand(node, x, opset):
    shape = [int(d) for d in x[1]]
    target = np.broadcast_shapes(x[0].shape, tuple(shape))
    return [np.broadcast_to(x[0], target)]  # a read-only view: no memory for the repeated values


@kernel("ConstantOfShape")
def _constant_of_shape(node, x, opset):
    fill = node.attr("value")
    value = np.zeros(1, dtype=np.float32) if fill is None else np.asarray(fill).reshape(-1)
    return [np.broadcast_to(value[:1].reshape(()), tuple(int(d) for d in x[0]))]


@kernel("Reshape")
def _reshape(node, x, opset):
    shape = [int(d) for d in (x[1] if opset >= 5 else node.attr("shape"))]
    if not node.attr("allowzero", 0):
        shape = [x[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x[0].reshape(shape)]


@kernel("Flatten")
def _flatten(node, x, opset):
    axis = node.attr("axis", 1)  # in [-rank, rank]: axis == rank puts every dim in the outer one
    axis = axis + x[0].ndim if axis < 0 else axis
    outer = int(np.prod(x[0].shape[:axis], dtype=np.int64))
    return [x[0].reshape(outer, -1)]


@kernel("Transpose")
def _transpose(node, x, opset):
    return [np.transpose(x[0], node.attr("perm"))]


@kernel("Tile")
def _tile(node, x, opset):
    return [np.tile(x[0], [int(r) for r in x[1]])]


_REDUCE = {"ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min,
           "ReduceMean": np.mean}


@kernel(*_REDUCE)
def _reduce(node, x, opset):
    since = 13 if node.op_type == "ReduceSum" else 18
    axes = _axes(node, x, opset, since)
    keepdims = bool(node.attr("keepdims", 1))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [x[0]]
        axes = None
    data = x[0]
    if axes is not None and not all(-data.ndim <= a < data.ndim for a in axes):
        return None
    axis = None if axes is None else tuple(a % data.ndim for a in axes)
    if _reduce_differs(node.op_type, data, axis):
        return None
    result = _REDUCE[node.op_type](data, axis=axis, keepdims=keepdims)
    return [np.asarray(result).astype(data.dtype)]


#: Integers whose sums and products float64 holds exactly: beyond, runtimes differ (onnxruntime sums
#: int64 through doubles) or wrap around.
EXACT_INTEGER = 2 ** 53


def _reduce_differs(op: str, data: np.ndarray, axis) -> bool:
    """Cases where numpy's reduction is not onnxruntime's: empty tensors (numpy gives NaN or fails for the
    mean, max or min of an empty set, runtimes 0 or +-inf, and onnxruntime keeps an empty axis of
    ReduceSum), max or min over NaN (onnxruntime skips it), fp16 sums (runtimes accumulate in fp32), integer
    sums and products that may overflow. The runtime computes those when folding, so the folded value is
    its value."""
    if data.size == 0:
        return True
    if op in ("ReduceMax", "ReduceMin") and data.dtype.kind == "f" and np.isnan(data).any():
        return True
    if data.dtype.kind in "iu" and op in ("ReduceSum", "ReduceMean", "ReduceProd") and data.size:
        magnitude = np.abs(data.astype(np.float64))
        bound = magnitude.sum() if op != "ReduceProd" else np.prod(np.maximum(magnitude, 1.0))
        return not bound < EXACT_INTEGER
    return data.dtype == np.float16 and op in ("ReduceSum", "ReduceMean", "ReduceProd")


# --- more kernels for constant folding (ops that show up on weights and shape arithmetic) -----------------
_FLOAT_UNARY = {"Relu": lambda a: np.maximum(a, np.zeros((), a.dtype)),
                "Sigmoid": lambda a: 1 / (1 + np.exp(-a)), "Tanh": np.tanh, "Sin": np.sin, "Cos": np.cos,
                "Sign": np.sign, "Round": np.round}


@kernel(*_FLOAT_UNARY)
def _float_unary(node, x, opset):
    if node.op_type != "Sign" and not np.issubdtype(x[0].dtype, np.floating) and node.op_type != "Relu":
        return None
    data = x[0].astype(np.float32) if x[0].dtype == np.float16 else x[0]  # fp16 math in fp32, as runtimes do
    return [np.asarray(_FLOAT_UNARY[node.op_type](data)).astype(x[0].dtype)]


@kernel("Pow")
def _pow(node, x, opset):
    base, exponent = x
    if not np.issubdtype(base.dtype, np.floating):
        return None  # integer powers: leave the edge cases to the runtime
    return [np.power(base, exponent.astype(base.dtype)).astype(base.dtype)]


@kernel("Mod")
def _mod(node, x, opset):
    a, b = x
    _check_divisor(a, b)
    if node.attr("fmod", 0):
        return [np.fmod(a, b).astype(a.dtype)]
    if not np.issubdtype(a.dtype, np.integer):
        raise Undefined("a float Mod needs fmod=1")  # an error at run time
    return [np.mod(a, b).astype(a.dtype)]


@kernel("Clip")
def _clip(node, x, opset):
    data = x[0]
    if opset < 11:
        low, high = node.attr("min"), node.attr("max")
    else:
        low = x[1] if len(x) > 1 else None
        high = x[2] if len(x) > 2 else None
    if any(b is not None and np.asarray(b).dtype.kind == "f" and np.isnan(b).any() for b in (low, high)):
        return None  # onnxruntime ignores a NaN bound, numpy spreads it
    result = data
    if low is not None:
        result = np.maximum(result, np.asarray(low, dtype=data.dtype))
    if high is not None:
        result = np.minimum(result, np.asarray(high, dtype=data.dtype))
    return [np.asarray(result, dtype=data.dtype)]


@kernel("Sum", "Mean")
def _sum_mean(node, x, opset):
    result = x[0]
    for other in x[1:]:
        result = result + other
    if node.op_type == "Mean":
        result = result / len(x)
    return [np.asarray(result).astype(x[0].dtype)]


@kernel("MatMul")
def _matmul(node, x, opset):
    if x[0].dtype == np.float16:
        return None  # numpy accumulates fp16 products in fp16, runtimes in fp32
    return [np.matmul(x[0], x[1]).astype(np.result_type(x[0], x[1]))]


@kernel("NonZero")
def _non_zero(node, x, opset):
    return [np.array(np.nonzero(x[0]), dtype=np.int64).reshape(x[0].ndim, -1)]


@kernel("CastLike")
def _cast_like(node, x, opset):
    return [x[0].astype(x[1].dtype)]
