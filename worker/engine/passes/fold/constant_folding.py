"""constant_folding (NNVM's PrecomputePrune): a node whose inputs are all known at optimization time is
computed now and replaced by initializers, names kept.

    w:init -> Transpose -> wt -> MatMul(x, wt)    becomes    wt:init -> MatMul(x, wt)

Numpy kernels compute the common ops, onnxruntime the rest (as onnxsim does), ``onnx.reference`` what
onnxruntime cannot. Never folded: non-deterministic ops, QuantizeLinear/DequantizeLinear (a quantized model
keeps its Q/DQ pairs; only a DequantizeLinear of an int32 bias folds, to a float bias of the same size), ops
with subgraphs (If with a constant condition is inlined by its own pass), ops of other domains, and nodes
producing a graph output. A ConstantOfShape, Tile, Expand or Range whose output
would add more than ``GROWTH_LIMIT`` bytes to the model is kept unless its result ends up as a weight input
(Conv/ConvTranspose W and B, Gemm/MatMul B and C, BatchNormalization parameters, ...): the light model zoo
makes every weight with ConstantOfShape.
Memory: a ConstantOfShape fill, and any view op or elementwise op of such a fill, stays a broadcast view
(no memory) until the writer streams it; other results above ``MAX_FOLDED_BYTES`` are not computed, and the
folded results of one run may add at most the run's budget (``worker.engine.limits``: ``max_folded_mb``, and
no more than keeps the model within its output limit) to the model: an uploaded model could otherwise ask for
a fill of any size as a weight.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from worker.engine.evaluate import NONDETERMINISTIC, evaluate
from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels.ops import SHAPE_INPUTS
from worker.engine.limits import elements_from_values, size_text as _size_text
from worker.engine.passes.base import Analysis, PassContext, PassKind, PassResult
from worker.engine.passes.support.arrays import is_uniform
from worker.engine.passes.support.constants import replace_with_constant
from worker.engine.passes.support.shapes import static_shape
from worker.engine.passes.registry import register_pass

#: Ops that make a large tensor out of small inputs, as onnxsim counts them (plus Range).
GENERATORS = frozenset({"ConstantOfShape", "Tile", "Expand", "Range"})
#: Bytes a generator may add to the model (output minus inputs) when no weight input reads its result.
GROWTH_LIMIT = 64 << 10
#: Largest result computed in memory (a broadcast view of one value has no such limit).
MAX_FOLDED_BYTES = 512 << 20

QDQ = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
#: Inputs that runtimes and fusions take as weights: op -> input slots.
WEIGHT_SLOTS = {
    "Conv": {1, 2}, "ConvTranspose": {1, 2}, "Gemm": {1, 2}, "MatMul": {1}, "BatchNormalization": {1, 2, 3, 4},
    "InstanceNormalization": {1, 2}, "LayerNormalization": {1, 2}, "GroupNormalization": {1, 2},
    "PRelu": {1}, "Gather": {0}, "LSTM": {1, 2, 3}, "GRU": {1, 2, 3}, "RNN": {1, 2, 3},
    "ConvInteger": {1}, "MatMulInteger": {1}, "DeformConv": {1, 3},
}
#: Ops whose output is a rearrangement of input 0's elements: a broadcast of one value stays one.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile", "Identity",
                      "Slice", "Gather"})
ELEMENTWISE = frozenset({"Cast", "Neg", "Abs", "Relu", "Sqrt", "Exp", "Log", "Reciprocal", "Sigmoid", "Tanh",
                         "Floor", "Ceil", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Clip"})


def never_folded(node: Node) -> str | None:
    """Why ``node`` is never folded, or None."""
    if node.op_type in NONDETERMINISTIC:
        return "it is not deterministic"
    if node.op_type in QDQ and not is_bias_dequantize(node):
        return "it is kept so that the model stays quantized"
    if node.subgraphs():
        return "it has subgraphs"
    if any(value.type_proto is not None for value in node.outputs):
        return "it produces a sequence, map or optional"
    return None


def is_bias_dequantize(node: Node) -> bool:
    """A DequantizeLinear of 32-bit integers: a quantized model's bias (no 8-bit kernel reads int32 data), whose
    float value takes no more bytes than it does; kernels that run the op quantized take a float bias (the
    quantized forms re-quantize it), so it folds like any constant. Weights in 8 bits keep their
    DequantizeLinear: folding them would store them in 32."""
    return node.op_type == "DequantizeLinear" and node.input(0) is not None \
        and node.input(0).dtype == TensorProto.INT32


def feeds_weight(value: Value, depth: int = 0, seen: set[int] | None = None) -> bool:
    """A weight input reads ``value``, directly or through nodes that will fold too (each value looked at once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return False
    seen.add(id(value))
    for use in value.uses:
        node = use.node
        if use.slot in WEIGHT_SLOTS.get(node.op_type, ()) and not node.domain:
            return True
        if depth < 8 and not node.domain and never_folded(node) is None \
                and all(v is None or v is value or v.constant_value() is not None for v in node.inputs) \
                and any(feeds_weight(out, depth + 1, seen) for out in node.outputs):
            return True
    return False


def _itemsize(value: Value) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(value.dtype)).itemsize if value.dtype else 8
    except (KeyError, TypeError, ValueError):
        return 8


def _count_from_values(node: Node, inputs: list) -> int | None:
    """Element count of ops whose output size follows from input values, before computing them."""
    if node.op_type.startswith("Reduce") and inputs and inputs[0] is not None:
        return max(inputs[0].size, 1)  # no larger than its input (or one value): its shape may be unknown when
        # the runtime's differs from onnx's (empty inputs)
    return elements_from_values(node.op_type, inputs[0].shape if inputs and inputs[0] is not None else None, inputs)


#: Elementwise ops beyond ELEMENTWISE whose output is their inputs broadcast (comparisons, logic, Where, Mod).
BROADCASTING = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not",
                          "Where", "Mod"})
#: Ops whose output holds exactly their first input's elements, whatever its shape.
SAME_COUNT_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Cast",
                            "CastLike"})


def _count_from_input_shapes(node: Node, inputs: list) -> int | None:
    """Element count from the constant inputs themselves, for a node whose inferred type went stale when an
    earlier fold turned its input into a constant (an Expand over torchscript's Where(Equal(s, -1), 1, s)
    shape, folded: the Unsqueeze after it still read [7, unk__202, 1], and swin_t's whole shifted-window
    mask stayed unfolded)."""
    present = [a for a in inputs if a is not None]
    if not present or len(present) != len([v for v in node.inputs if v is not None]):
        return None
    data = present[0]
    if node.op_type in SAME_COUNT_OPS or node.op_type == "Slice":  # a Slice keeps at most its input
        return int(data.size)
    if node.op_type == "Shape":
        return data.ndim
    if node.op_type == "Size":
        return 1
    if node.op_type == "Concat":
        return sum(int(a.size) for a in present)
    if node.op_type == "NonZero":  # one index per axis of each nonzero element (Longformer's window masks)
        return max(data.ndim, 1) * int(np.count_nonzero(data))
    if node.op_type == "Compress" and len(present) == 2:  # at most the selected slices (no axis: elements)
        axis = node.attr("axis")
        slice_size = 1 if axis is None or not data.ndim else data.size // max(data.shape[int(axis) % data.ndim], 1)
        return int(np.count_nonzero(present[1])) * slice_size
    if node.op_type == "Gather" and len(present) == 2 and data.ndim:
        axis = int(node.attr("axis", 0)) % data.ndim
        return int(data.size // max(data.shape[axis], 1) * present[1].size) if data.shape[axis] else 0
    if node.op_type in ELEMENTWISE or node.op_type in BROADCASTING:
        try:
            return math.prod(np.broadcast_shapes(*(np.shape(a) for a in present)))
        except ValueError:
            return None
    return None


def output_bytes(node: Node, inputs: list) -> int | None:
    """Bytes of the node's outputs from type inference, or from the input values for ops sized by them."""
    total = 0
    for value in node.outputs:
        shape = static_shape(value)
        count = math.prod(shape) if shape is not None else None  # Python ints: no int64 wrap-around
        if count is None and len(node.outputs) == 1:
            count = _count_from_values(node, inputs)
        if count is None and len(node.outputs) == 1:
            count = _count_from_input_shapes(node, inputs)
        if count is None or count < 0:
            return None
        total += count * _itemsize(value)
    return total


def size_refusal(node: Node, inputs: list, uniform: bool, budget: list[int]) -> str | None:
    """Why the node's result is too large to fold, or None; ``budget`` holds the constant bytes still allowed."""
    size = output_bytes(node, inputs)
    if size is None:
        return "the size of its output is not known"
    if size > budget[0]:
        return (f"folding it would add {_size_text(size)} of constants, beyond what is left of this run's "
                f"folding budget ({_size_text(max(budget[0], 0))}; limits max_folded_mb and max_output_mb)")
    if size > MAX_FOLDED_BYTES and not uniform:
        return f"its output of {_size_text(size)} is above the {_size_text(MAX_FOLDED_BYTES)} folding limit"
    growth = size - sum(a.nbytes for a in inputs if a is not None)
    if node.op_type in GENERATORS and growth > GROWTH_LIMIT and not any(feeds_weight(v) for v in node.outputs):
        return (f"folding it would add {_size_text(growth)} of constants (above the "
                f"{_size_text(GROWTH_LIMIT)} limit) that no weight input reads")
    return None


def stays_uniform(node: Node, inputs: list) -> bool:
    """The result is one value repeated (a view op of such an input, or an elementwise op of only such)."""
    if node.op_type == "ConstantOfShape":
        return True
    present = [a for a in inputs if a is not None]
    shape = static_shape(node.output()) if len(node.outputs) == 1 else None
    if not present or shape is None or math.prod(shape) == 0 or any(a.size == 0 for a in present):
        return False  # an empty input has no element to repeat, an empty output nothing to repeat it in
    if node.op_type in VIEW_OPS:
        return present[0].size >= 1 and is_uniform(present[0])
    return node.op_type in ELEMENTWISE and all(is_uniform(a) for a in present)


def evaluate_uniform(node: Node, inputs: list, opset: int) -> list[np.ndarray] | None:
    """Compute a uniform result from one element of each input and broadcast it (no memory)."""
    shape = static_shape(node.output())
    if node.op_type in VIEW_OPS:
        first = np.asarray(inputs[0][(0,) * inputs[0].ndim])
        return [np.broadcast_to(first, shape)]
    singles = [None if a is None else np.asarray(a[(0,) * a.ndim]).reshape((1,) * a.ndim) for a in inputs]
    outputs = evaluate(node, singles, opset, runtime=True)
    if outputs is None:
        return None
    return [np.broadcast_to(outputs[0].reshape(-1)[:1].reshape(()), shape)]


def compute(node: Node, inputs: list, opset: int, budget: list[int]) -> list[np.ndarray] | str:
    uniform = stays_uniform(node, inputs)
    reason = size_refusal(node, inputs, uniform, budget)
    if reason is not None:
        return reason
    outputs = evaluate_uniform(node, inputs, opset) if uniform and node.op_type != "ConstantOfShape" \
        else evaluate(node, inputs, opset, runtime=True)
    if outputs is None or len(outputs) < len(node.outputs):
        return "it could not be evaluated"
    checked = []
    for value, array in zip(node.outputs, outputs):
        declared = static_shape(value)
        checked.append(array)
        if not value.is_used:
            continue
        if value.dtype and helper.np_dtype_to_tensor_dtype(array.dtype) != value.dtype:
            return f"evaluating it gave {array.dtype} for {value.name!r}, which the model types otherwise"
        if declared is not None and declared != array.shape:
            return f"evaluating it gave shape {list(array.shape)} for {value.name!r}, the model says {list(declared)}"
    return checked


def fold_node(ctx: PassContext, graph: Graph, node: Node, result: PassResult, budget: list[int]) -> None:
    if node.domain or node.op_type == "Constant" or not any(v.is_used for v in node.outputs):
        return
    inputs = [v.constant_value() if v is not None else None for v in node.inputs]
    if any(v is not None and a is None for v, a in zip(node.inputs, inputs)):
        return  # some input is only known at run time
    reason = never_folded(node)
    outputs_used = [v for v in node.outputs if v.is_used]
    if reason is None and any(v.is_graph_output for v in outputs_used):
        reason = "its output is a graph output, which must stay produced by a node"
    computed = compute(node, inputs, ctx.opset(), budget) if reason is None else reason
    if isinstance(computed, str):
        result.refused(f"constant_folding: {node.op_type}: {computed}")
        return
    budget[0] -= sum(int(array.nbytes) for array in computed)
    if any(v.is_used and static_shape(v) != tuple(np.shape(a)) for v, a in zip(node.outputs, computed)) \
            or any(_sizes_an_unknown_shape(v) for v in outputs_used):
        result.data["typed_anew"] = result.data.get("typed_anew", 0) + 1  # its readers' types derive from a guess
    replace(graph, node, computed)
    result.rewrote({"rule": "constant_folding", "from": [node.name], "to": []})


def _sizes_an_unknown_shape(value: Value) -> bool:
    """A reader takes ``value`` where its contents decide an output shape (a Pad's pads, a Reshape's shape)
    and that output is not static yet: inference did not know the value, and will size the output now."""
    return any(use.slot in SHAPE_INPUTS.get(use.node.op_type, ()) and not use.node.domain
               and any(out is not None and out.is_used and not out.is_static for out in use.node.outputs)
               for use in value.uses)


def replace(graph: Graph, node: Node, arrays: list[np.ndarray]) -> None:
    """Readers of the node's outputs read new initializers of the main graph, under the outputs' names."""
    for value, array in zip(node.outputs, arrays):
        if value.is_used:
            replace_with_constant(graph, value, array)
    graph.remove_node(node)


@register_pass(name="constant_folding", peer="NNVM", kind=PassKind.PROGRAM, level=1,
               invalidates=(Analysis.TYPES, Analysis.ORDER),
               description="compute nodes whose inputs are all constant (PrecomputePrune); large generated "
                           "tensors only when they become weights")
def constant_folding(ctx: PassContext) -> PassResult:
    result = PassResult()
    limits = ctx.options.limits
    held = sum(v.nbytes for g in ctx.graph.all_graphs() for v in g.initializers.values())
    budget = [limits.max_folded_bytes if ctx.input_bytes is None
              else min(limits.max_folded_bytes, limits.output_limit(ctx.input_bytes) - held)]
    for graph in ctx.graph.live_graphs():
        for node in graph:
            fold_node(ctx, graph, node, result, budget)
    if not result.data.get("typed_anew"):
        # every folded value had the shape inference gave it, so its readers' types hold; a value inference
        # could not size (swin's Expand of a computed shape) leaves its readers' types to infer again
        result.preserve(Analysis.TYPES)
    return result
