"""eliminate_shape_op: Shape -> Gather/Slice/Concat/... chains become constants where type inference knows
the dims they read, partially known shapes included.

    x:[N,3,224,224] -> Shape -> Slice(1:) -> s -> Reshape(y, s)    becomes    s = [3, 224, 224] (initializer)
    x:[N,C,?,?] -> Shape -> Slice(:1) -> Concat(., [-1]) -> Reshape(x, .)    becomes    Reshape(x, [0, -1])

Each 1-D integer tensor of a shape computation is tracked element by element as known (an int) or not
(a symbolic or unknown dim), through Shape (with start/end), Size, Gather, Slice, Concat, Squeeze,
Unsqueeze, Cast to an integer type, Identity, Add, Sub, Mul, Div, Equal (a dim is never equal to a negative
constant) and Where with a known condition: TorchScript's ``Where(Equal(v, -1), 1, v)`` of an expand is v with
ones where v says -1. A value whose every element is known becomes an initializer under its own name where
something other than this tracking reads it; the nodes that computed it go away once unused. Constant folding
takes the chain from there.

An unknown element read by Shape remembers where it came from (``DimOf``: dim i of value x). A Reshape of x
whose shape is known but for dims of x at their own positions gets a constant shape with 0 there, which
Reshape (allowzero 0) reads as "copy this dim of the input" (onnxruntime's reshape fusion), and one dim known
neither way gets -1 (the element count fixes it). Exact. A dim of x counts as read off x also when it was read
off a value x's dim was carried from unchanged (``view(h.size(0), h.size(1), 4, 16)`` of ``h @ Wq``: back
through MatMul by a matrix, elementwise ops that do not broadcast it, Transpose, Unsqueeze / Squeeze), so a
dynamic export whose inference lost the dims' names (``unk__N``) splits its heads by a constant shape too. A
dim the shape computes rather than reads (the dynamo exporter's sequence ``((samples//20)) - 1``, arithmetic on
the input's size) is copied too when the Reshape's input and output carry one name of the model's there; a
Reshape with allowzero 1 (the dynamo exporter's) gets the copies and allowzero 0 when its shape has no 0 of
its own. An Expand's target dims that are the input's own
dims (aligned from the right) become 1, which broadcasts to the input's dim: the target is then constant, and an
attention mask expanded to ``(batch, 1, sequence, sequence)`` keeps those names instead of four made-up ones
(and so does every attention it feeds). Exact. A dim read
off another value counts as x's when both carry the same name of the model's (``batch``: a dim_param names one
value in the whole model); names onnx makes up (``unk__N``) are numbered afresh by each inference, so never.
When that Reshape's output was not fully known, or a value it folds is read as the shape of such a Reshape or
Expand (through a Where, a Concat, ...), the pass leaves the types stale (it declares it may): the manager runs
type inference before the next pass, so the Reshape and what follows it get typed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from onnx import TensorProto, helper

from worker.engine.ir.value import nameable
from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels.ops import BROADCASTING_OPS
from worker.engine.passes.base import Analysis, PassContext, PassKind, PassResult
from worker.engine.passes.support.constants import replace_with_constant
from worker.engine.passes.support.operands import axes_of, int_list
from worker.engine.passes.registry import register_pass

#: Longest vector tracked (shapes are short; this bounds the work on odd models).
MAX_TRACKED = 64
INTEGER_TYPES = {TensorProto.INT64, TensorProto.INT32}


@dataclass(frozen=True, eq=False)
class DimOf:
    """An element not known offline that is dim ``index`` of ``value``'s shape."""

    value: Value
    index: int


Item = int | DimOf | None


@dataclass(frozen=True)
class Partial:
    """An integer scalar or vector whose elements are known (int) or not (a DimOf, or None)."""

    items: tuple[Item, ...]
    scalar: bool = False
    dtype: int = TensorProto.INT64

    @property
    def complete(self) -> bool:
        return all(isinstance(x, int) for x in self.items)

    def array(self) -> np.ndarray:
        data = np.array(self.items, dtype=helper.tensor_dtype_to_np_dtype(self.dtype))
        return data.reshape(()) if self.scalar else data


Lookup = Callable[[Value | None], Partial | None]


def _shape(node: Node, get: Lookup, opset: int) -> Partial | None:
    shape = node.input(0).shape
    if shape is None:
        return None
    data = node.input(0)
    dims = [d if isinstance(d, int) else DimOf(data, i) for i, d in enumerate(shape)]
    return Partial(tuple(dims[node.attr("start", 0):node.attr("end")]))


def _size(node: Node, get: Lookup, opset: int) -> Partial | None:
    shape = node.input(0).shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return Partial((int(np.prod(shape, dtype=np.int64)),), scalar=True)


def _gather(node: Node, get: Lookup, opset: int) -> Partial | None:
    data, indices = get(node.input(0)), node.input(1).constant_value()
    if data is None or data.scalar or indices is None or node.attr("axis", 0) not in (0, -1):
        return None
    n = len(data.items)
    positions = [int(i) for i in np.reshape(indices, -1)]
    if any(not -n <= i < n for i in positions):
        return None  # an index out of range: leave it to the runtime to complain
    picked = [data.items[i] for i in positions]
    return Partial(tuple(picked), scalar=indices.ndim == 0, dtype=data.dtype)


def _slice(node: Node, get: Lookup, opset: int) -> Partial | None:
    data = get(node.input(0))
    if data is None or data.scalar:
        return None
    if opset < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        starts, ends = int_list(node.input(1)), int_list(node.input(2))
        axes = int_list(node.input(3)) if node.input(3) is not None else None
        steps = int_list(node.input(4)) if node.input(4) is not None else None
        if (node.input(3) is not None and axes is None) or (node.input(4) is not None and steps is None):
            return None
    if starts is None or ends is None or len(starts) != 1 or (axes is not None and list(axes) not in ([0], [-1])):
        return None
    step = steps[0] if steps else 1
    if step == 0:
        return None
    chosen = range(*slice(int(starts[0]), int(ends[0]), step).indices(len(data.items)))
    return Partial(tuple(data.items[i] for i in chosen), dtype=data.dtype)


def _concat(node: Node, get: Lookup, opset: int) -> Partial | None:
    parts = [get(v) for v in node.inputs if v is not None]
    if not parts or any(p is None or p.scalar for p in parts) or node.attr("axis", 0) not in (0, -1):
        return None
    return Partial(tuple(x for p in parts for x in p.items), dtype=parts[0].dtype)


def _unsqueeze(node: Node, get: Lookup, opset: int) -> Partial | None:
    data = get(node.input(0))
    if data is None or not data.scalar or axes_of(node, opset) not in ([0], [-1]):
        return None
    return Partial(data.items, dtype=data.dtype)


def _squeeze(node: Node, get: Lookup, opset: int) -> Partial | None:
    data = get(node.input(0))
    axes = axes_of(node, opset)
    if data is None or data.scalar or len(data.items) != 1 or axes not in (None, [0], [-1]):
        return None
    return Partial(data.items, scalar=True, dtype=data.dtype)


def _cast(node: Node, get: Lookup, opset: int) -> Partial | None:
    data = get(node.input(0))
    to = node.attr("to")
    if data is None or to not in INTEGER_TYPES:
        return None
    return Partial(data.items, data.scalar, to)


def _identity(node: Node, get: Lookup, opset: int) -> Partial | None:
    return get(node.input(0))


def _truncating_div(a: int, b: int) -> int | None:
    if b == 0:
        return None
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


ARITHMETIC = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
              "Div": _truncating_div}


def _broadcast(*parts: Partial) -> list[tuple[Item, ...]] | None:
    """The parts' items broadcast to one length (a single item repeats), or None where lengths disagree."""
    lengths = {len(p.items) for p in parts} - {1}
    if len(lengths) > 1:
        return None
    n = lengths.pop() if lengths else 1
    return [p.items * n if len(p.items) == 1 else p.items for p in parts]


def _two_operands(node: Node, get: Lookup) -> tuple[Partial, list[tuple[Item, ...]]] | None:
    """For an elementwise op of two tracked values of one type: the operand whose form the result takes (a
    vector if either is one) and both operands' items broadcast."""
    left, right = get(node.input(0)), get(node.input(1))
    if left is None or right is None or left.dtype != right.dtype:
        return None
    items = _broadcast(left, right)
    return None if items is None else (left if right.scalar else right, items)


def _arithmetic(node: Node, get: Lookup, opset: int) -> Partial | None:
    operands = _two_operands(node, get)
    if operands is None:
        return None
    shaped, (a, b) = operands
    fn = ARITHMETIC[node.op_type]
    items = tuple(fn(x, y) if isinstance(x, int) and isinstance(y, int) else None for x, y in zip(a, b))
    items = tuple(x if x is None or -2**63 <= x < 2**63 else None for x in items)
    return Partial(items, scalar=shaped.scalar, dtype=shaped.dtype)


def _equal_items(a: Item, b: Item) -> bool | None:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, DimOf) and isinstance(b, DimOf) and a.value is b.value and a.index == b.index:
        return True
    if isinstance(a, int) and isinstance(b, DimOf):
        a, b = b, a
    if isinstance(a, DimOf) and isinstance(b, int) and b < 0:
        return False  # a dim is never negative (TorchScript's expand compares its sizes with -1)
    return None


def _equal(node: Node, get: Lookup, opset: int) -> Partial | None:
    operands = _two_operands(node, get)
    if operands is None:
        return None
    shaped, (a, b) = operands
    return Partial(tuple(_equal_items(x, y) for x, y in zip(a, b)), scalar=shaped.scalar, dtype=TensorProto.BOOL)


def _where(node: Node, get: Lookup, opset: int) -> Partial | None:
    condition, x, y = (get(node.input(i)) for i in range(3))
    if condition is None or not condition.complete or x is None or y is None or x.dtype != y.dtype:
        return None
    items = _broadcast(condition, x, y)
    if items is None:
        return None
    c, a, b = items
    return Partial(tuple(u if bool(k) else v for k, u, v in zip(c, a, b)),
                   scalar=condition.scalar and x.scalar and y.scalar, dtype=x.dtype)


TRACKERS = {"Shape": _shape, "Size": _size, "Gather": _gather, "Slice": _slice, "Concat": _concat,
            "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Cast": _cast, "Identity": _identity, "Equal": _equal,
            "Where": _where,
            **{op: _arithmetic for op in ARITHMETIC}}
#: The element types of tracked values: integer vectors, and Equal's booleans.
TRACKED_TYPES = INTEGER_TYPES | {TensorProto.BOOL}


def _constant(value: Value | None) -> Partial | None:
    """A constant integer vector, or a boolean one (an Equal folded before: TorchScript's ``Equal(v, -1)`` of an
    expand's sizes where v holds the -1 itself), as a Partial."""
    data = value.constant_value() if value is not None else None
    if data is None or data.ndim > 1 or data.size > MAX_TRACKED or value.dtype not in TRACKED_TYPES:
        return None
    return Partial(tuple(int(x) for x in np.reshape(data, -1)), scalar=data.ndim == 0, dtype=value.dtype)


def _opaque(value: Value | None) -> Partial | None:
    """An integer scalar or short vector of static length that nothing here computes: every element unknown
    (a Concat of it and of dims read by Shape still knows those)."""
    if value is None or value.dtype not in INTEGER_TYPES or not value.is_static or len(value.shape) > 1:
        return None
    size = value.shape[0] if value.shape else 1
    if size > MAX_TRACKED:
        return None
    return Partial((None,) * size, scalar=not value.shape, dtype=value.dtype)


def track(graph: Graph, opset: int) -> dict[Value, Partial]:
    """The partially known integer vectors of ``graph``, in graph order."""
    known: dict[Value, Partial] = {}

    def get(value: Value | None) -> Partial | None:
        return known.get(value) if value in known else _constant(value) or _opaque(value)

    for node in graph:
        tracker = TRACKERS.get(node.op_type)
        if tracker is None or node.domain or len(node.outputs) != 1 or node.input(0) is None:
            continue
        out = node.output()
        if out.dtype and out.dtype not in TRACKED_TYPES:
            continue
        partial = tracker(node, get, opset)
        if partial is not None and len(partial.items) <= MAX_TRACKED:
            known[out] = partial
    return known


def foldable(known: dict[Value, Partial], graph: Graph) -> list[Value]:
    """Complete values read by something the tracking does not replace (the frontier of each chain)."""
    complete = {v for v, p in known.items() if p.complete and v.constant_value() is None}
    chosen = []
    for value in complete:
        if value.is_graph_output or value.producer is None:
            continue
        if any(use.node.graph is not graph or use.node.output(0) not in complete
               for use in value.uses if use.node.outputs):
            chosen.append(value)
    return sorted(chosen, key=lambda v: v.producer.position)


def replace(graph: Graph, value: Value, partial: Partial) -> list[str]:
    """Readers of ``value`` read an initializer instead; returns the names of the nodes that went away."""
    producer = value.producer
    replace_with_constant(graph, value, partial.array())
    return graph.remove_unused([producer])


@register_pass(name="eliminate_shape_op", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="Shape -> Gather/Slice/Concat chains whose dims are known become constants, "
                           "partially known shapes too", invalidates=(Analysis.TYPES, Analysis.ORDER))
def eliminate_shape_op(ctx: PassContext) -> PassResult:
    result = PassResult()
    refined = False
    for graph in ctx.graph.live_graphs():
        known = track(graph, ctx.opset())
        for value in foldable(known, graph):
            partial = known[value]
            declared = value.shape if value.is_static else None
            if (value.dtype and value.dtype != partial.dtype) or \
                    (declared is not None and tuple(declared) != partial.array().shape):
                result.refused(f"eliminate_shape_op: {value.name!r} is typed otherwise than its computation")
                continue
            refined = refined or _read_as_shape(value)
            names = replace(graph, value, partial)
            result.rewrote({"rule": "eliminate_shape_op", "from": names, "to": []})
        for op_type, (rule, constant_shape) in SHAPE_READERS.items():
            for node in graph.nodes_of_type(op_type):
                shape = constant_shape(node, known)
                if shape is not None:
                    old = node.input(1)
                    node.set_input(1, graph.add_initializer(f"{node.name}_shape", shape))
                    if op_type == "Reshape" and node.attr("allowzero", 0):
                        node.remove_attr("allowzero")  # its 0s copy dims now; it has no other 0 (checked)
                    refined = refined or not node.output(0).is_static
                    names = graph.remove_unused([old.producer]) if old.producer is not None else []
                    result.rewrote({"rule": rule, "from": names, "to": [node.name]})
    if not refined:  # a refined Reshape or Expand: inference could not read all of its shape; now it can
        result.preserve(Analysis.TYPES)
    return result


#: Ops that pass a shape vector on to what reads it as a shape (TorchScript's ``Where(Equal(v, -1), 1, v)``).
SHAPE_PASSING = frozenset({"Where", "Concat", "Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze"})


def _read_as_shape(value: Value) -> bool:
    """A Reshape or Expand whose output is not fully known reads ``value`` as its shape, directly or through
    ``SHAPE_PASSING`` ops: folded to a constant, its output can be inferred better (``inference.dims_vector``
    reads a Where whose condition is a constant)."""
    frontier, seen = [value], set()
    while frontier:
        current = frontier.pop()
        for node in current.consumers():
            if node.domain or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in SHAPE_READERS and node.input(1) is current and not node.output(0).is_static:
                return True
            if node.op_type in SHAPE_PASSING:
                frontier.extend(v for v in node.outputs if v is not None)
    return False


def _copying_shape(reshape: Node, known: dict[Value, Partial]) -> np.ndarray | None:
    """The constant shape of ``reshape`` with 0 for each dim it copies from its own input, or None. With
    allowzero (the dynamo exporter sets it on every Reshape) a 0 in the target is a 0, not a copy: the target
    qualifies only without a constant 0 and with every dim known (a dim of the input read at run time as 0 is
    copied as 0 too), and the rewrite turns allowzero off (``SHAPE_READERS``' caller)."""
    data, partial = reshape.input(0), known.get(reshape.input(1))
    if partial is None or partial.complete or partial.scalar:
        return None
    # allowzero 1 (the dynamo exporter's) reads a 0 as an empty dim: the copies below are 0s of allowzero 0,
    # which ``eliminate_shape_op`` sets, so a shape that asks for an empty dim itself stays
    allowzero = reshape.attr("allowzero", 0) != 0
    if allowzero and 0 in [item for item in partial.items if isinstance(item, int)]:
        return None
    out = reshape.outputs[0].shape
    items: list[int | None] = []
    for position, item in enumerate(partial.items):
        if isinstance(item, DimOf) and _same_dim(item, data, position):
            items.append(0)
        elif isinstance(item, int):
            items.append(item)
        elif _named_alike(out, data.shape, position):  # a dim computed, not read: its name says it is the input's
            items.append(0)
        else:
            items.append(None)
    # one dim known neither offline nor as a dim of the input: the element count fixes it, as -1 (a dynamic
    # batch joined with the heads, (batch * heads, s, d) -> (batch, heads, s, d)); the others must be positive
    # or copied, so that their product is not 0 wherever the input has elements
    if items.count(None) == 1 and all(i is None or i >= 0 for i in items) and not allowzero:
        items[items.index(None)] = -1
    return np.array(items, dtype=np.int64) if None not in items else None


def _named_alike(ours: tuple | None, theirs: tuple | None, position: int) -> bool:
    """Both shapes have at ``position`` one symbolic name of the model's (not ``unk__N``): the dims are equal
    (the dynamo exporter's ``((samples//20)) - 1`` of a Reshape's input and output, the sequence it computed
    from the input's size)."""
    if ours is None or theirs is None or position >= len(ours) or position >= len(theirs):
        return False
    name = ours[position]
    return isinstance(name, str) and nameable(name) and name == theirs[position]


def _broadcasting_shape(expand: Node, known: dict[Value, Partial]) -> np.ndarray | None:
    """The constant target shape of ``expand`` with 1 for each dim it reads off its own input, or None."""
    data, partial = expand.input(0), known.get(expand.input(1))
    if partial is None or partial.complete or partial.scalar or data.shape is None:
        return None
    offset = len(partial.items) - len(data.shape)  # the target aligns with the input from the right
    items = []
    for position, item in enumerate(partial.items):
        if isinstance(item, int):
            items.append(item)
        elif isinstance(item, DimOf) and position >= offset and _same_dim(item, data, position - offset):
            items.append(1)
        else:
            return None
    return np.array(items, dtype=np.int64)


#: Ops whose second input is a shape that a partly known one can replace by a constant: the rule's name in the
#: trace and the constant shape (or None).
SHAPE_READERS = {"Reshape": ("reshape_copy_dims", _copying_shape), "Expand": ("expand_copy_dims", _broadcasting_shape)}


def _same_dim(item: DimOf, data: Value, position: int) -> bool:
    """``item`` is dim ``position`` of ``data``: read off ``data`` there, off a value that dim was carried
    from unchanged (``_carried_from``: ``view(x.size(0), x.size(1), 4, 16)`` of ``x @ W``, whatever inference
    named the dims), or off another value whose dim has the same symbolic name (both dims ``batch``); type
    inference passes a name of the model's on only where dims are equal."""
    if _carried_from(item.value, item.index) == _carried_from(data, position):
        return True
    theirs, ours = item.value.shape, data.shape
    if theirs is None or ours is None or item.index >= len(theirs) or position >= len(ours):
        return False
    name = theirs[item.index]
    return isinstance(name, str) and not name.startswith("unk__") and name == ours[position]


#: Ops whose output has their first input's shape, whatever their other inputs are.
SHAPE_KEEPING = {"Relu", "Sigmoid", "Tanh", "Erf", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Cast",
                 "Identity", "Softmax", "LogSoftmax", "LayerNormalization", "Gelu", "HardSigmoid", "HardSwish",
                 "LeakyRelu", "Elu", "Selu", "Softplus", "Dropout", "Not", "IsNaN", "Sign", "Floor", "Ceil",
                 "Round", "Clip", "InstanceNormalization", "BatchNormalization", "SimplifiedLayerNormalization"}
#: Attention ops: their output has the query's dims but the last (the value's head size).
ATTENTION = {("", "Attention"), ("ai.onnx", "Attention"), ("mirserve", "ScaledDotProductAttention"),
             ("mirserve", "MultiHeadAttention")}
#: Longest chain of producers walked back (a transformer layer's projections are a few nodes from their input).
MAX_CARRY = 32


def _carried_from(value: Value, position: int) -> tuple[Value, int]:
    """The value and dim that dim ``position`` of ``value`` was carried from unchanged: back through ops that
    keep their first input's shape, elementwise ops whose other operands do not broadcast that dim, MatMul by a
    matrix (the leading dims of its first operand), attention (the query's dims but the last), Reshape where its
    constant shape has a 0 (a copy), Transpose (the dim its perm names) and Unsqueeze / Squeeze by constant
    axes; where none applies, the value itself. Two dims carried from one are equal
    wherever the model runs, named by inference or not (a dynamic TorchScript export's dims come out of the
    embedding's broadcasting Adds as ``unk__N``)."""
    for _ in range(MAX_CARRY):
        node, shape = value.producer, value.shape
        if node is None or shape is None or not 0 <= position < len(shape) or len(node.outputs) < 1 or \
                node.outputs[0] is not value or not node.inputs or node.input(0) is None:
            break
        source = node.input(0)
        op, rank = node.op_type, len(shape)
        if (node.domain, op) in ATTENTION:  # (batch, heads, seq, size) or (batch, seq, hidden): q's but the last
            if source.shape is None or len(source.shape) != rank or position >= rank - 1:
                break
        elif node.domain not in ("", "ai.onnx"):
            break
        elif op in SHAPE_KEEPING or op in BROADCASTING_OPS:
            others = [v for v in node.inputs[1:] if v is not None] if op in BROADCASTING_OPS else []
            if op == "Where":  # the condition broadcasts too: follow the first data operand only if all agree
                source, others = node.input(1), [node.input(0), node.input(2)]
            if source.shape is None or len(source.shape) != rank:
                break
            for other in others:
                their = other.shape
                if their is None:
                    return value, position
                at = position - (rank - len(their))
                if at >= 0 and their[at] != 1:
                    return value, position
        elif op == "MatMul":
            weight = node.input(1)
            if source.shape is None or len(source.shape) != rank or rank < 2 or position >= rank - 1 or \
                    weight.shape is None or len(weight.shape) != 2:
                break
        elif op == "Reshape":  # a 0 in a constant shape copies the input's dim at its position
            target = int_list(node.input(1))
            if target is None or position >= len(target) or target[position] != 0 or node.attr("allowzero", 0):
                break
        elif op == "Transpose":
            perm = node.attr("perm")
            if perm is None or len(perm) != rank:
                break
            position = perm[position]
        elif op in ("Unsqueeze", "Squeeze"):
            axes = int_list(node.input(1)) if len(node.inputs) > 1 else node.attr("axes")
            if source.shape is None or axes is None:
                break
            axes = sorted(a % (rank if op == "Unsqueeze" else len(source.shape)) for a in axes)
            if op == "Unsqueeze":
                if position in axes:
                    break
                position -= sum(1 for a in axes if a < position)
            else:
                kept = [i for i in range(len(source.shape)) if i not in axes]
                position = kept[position]
        else:
            break
        value = source
    return value, position
