"""Evaluate one node on known inputs: numpy kernels for the common ops, then onnxruntime (when asked, as
constant folding does) and ``onnx.reference`` for the rest.

Used by type inference to learn the values of shape subgraphs, and by constant folding. Callers decide what
is worth evaluating (sizes, determinism, Q/DQ); this module only computes, and returns None when it cannot.
ConstantOfShape and Expand of known values return read-only broadcast views: a folded weight filled with one
value then takes no memory until the writer streams it.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from onnx import helper

from worker.ir import Node

#: Ops whose result is not a function of their inputs: never evaluated.
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli", "Dropout_training"})

Kernel = Callable[[Node, list, int], "list[np.ndarray] | None"]
_KERNELS: dict[str, Kernel] = {}


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
    fn = _KERNELS.get(node.op_type)
    try:
        if fn is not None:
            outputs = fn(node, list(inputs), opset)
            if outputs is not None:
                return [np.asarray(o) for o in outputs]
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


def _node_proto(node: Node, inputs: Sequence[np.ndarray | None]):
    from worker.ir.serde import encode_attribute

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
    return _run_on_onnxruntime(model, {f"i{k}": np.ascontiguousarray(x) for k, x in enumerate(inputs)
                                       if x is not None})


def _run_on_onnxruntime(model, feeds: dict) -> list[np.ndarray] | None:
    """All outputs of ``model`` on onnxruntime's CPU provider, unoptimized; None when it refuses."""
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - onnxruntime is a core dependency
        return None
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
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
                feeds[name] = np.ascontiguousarray(x)
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
        index[axis] = slice(*slice(start, end, step).indices(data.shape[axis]))
    return [data[tuple(index)]]


@kernel("Cast")
def _cast(node, x, opset):
    return [x[0].astype(helper.tensor_dtype_to_np_dtype(node.attr("to")))]


def _int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero, as ONNX runtimes do (numpy's // floors)."""
    quotient = np.abs(a) // np.abs(b)
    return (np.sign(a) * np.sign(b) * quotient).astype(np.result_type(a, b))


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
    axis = node.attr("axis", 1) % (x[0].ndim or 1) if x[0].ndim else 0
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
    result = _REDUCE[node.op_type](x[0], axis=None if axes is None else tuple(axes), keepdims=keepdims)
    return [np.asarray(result).astype(x[0].dtype)]


# --- more kernels for constant folding (ops that show up on weights and shape arithmetic) -----------------
_FLOAT_UNARY = {"Relu": lambda a: np.maximum(a, np.zeros((), a.dtype)),
                "Sigmoid": lambda a: 1 / (1 + np.exp(-a)), "Tanh": np.tanh, "Sin": np.sin, "Cos": np.cos,
                "Sign": np.sign, "Round": np.round}


@kernel(*_FLOAT_UNARY)
def _float_unary(node, x, opset):
    if node.op_type != "Sign" and not np.issubdtype(x[0].dtype, np.floating) and node.op_type != "Relu":
        return None
    return [np.asarray(_FLOAT_UNARY[node.op_type](x[0])).astype(x[0].dtype)]


@kernel("Pow")
def _pow(node, x, opset):
    base, exponent = x
    if not np.issubdtype(base.dtype, np.floating):
        return None  # integer powers: leave the edge cases to the runtime
    return [np.power(base, exponent.astype(base.dtype)).astype(base.dtype)]


@kernel("Mod")
def _mod(node, x, opset):
    a, b = x
    if node.attr("fmod", 0):
        return [np.fmod(a, b).astype(a.dtype)]
    if not np.issubdtype(a.dtype, np.integer):
        return None  # float Mod needs fmod=1 by the spec
    return [np.mod(a, b).astype(a.dtype)]


@kernel("Clip")
def _clip(node, x, opset):
    data = x[0]
    if opset < 11:
        low, high = node.attr("min"), node.attr("max")
    else:
        low = x[1] if len(x) > 1 else None
        high = x[2] if len(x) > 2 else None
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
    return [np.matmul(x[0], x[1]).astype(np.result_type(x[0], x[1]))]


@kernel("NonZero")
def _non_zero(node, x, opset):
    return [np.array(np.nonzero(x[0]), dtype=np.int64).reshape(x[0].ndim, -1)]


@kernel("CastLike")
def _cast_like(node, x, opset):
    return [x[0].astype(x[1].dtype)]
