"""Type inference: a dtype and a shape for every value, nested bodies included (the library behind the
``type_inference`` pass, and the memory plan's analysis at sample sizes).

onnx's shape inference (with data propagation) does most of the work, but it cannot see through shape
subgraphs whose values it does not know (Shape -> Slice -> Concat -> Reshape, Range, Expand), and it keeps
stale value_info that exporters and quantizers leave behind. So we infer from scratch, from the user's input
shapes (like NNVM's shape dict, or onnxsim's overwrite-input-shape), then evaluate the small tensors whose
values are now known (shape arithmetic) and infer again with them as constants, until nothing new is learned.
Dims keep their symbolic names where they stay unknown; values left without a type are listed in the trace.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from worker.engine.errors import OptionsError
from worker.engine.evaluate import evaluate
from worker.engine.ir import Graph, Model, Value, model_to_proto
from worker.engine.ir.serde import encode_attribute, type_from_proto, value_info_proto
from worker.engine.ir.value import MADE_UP, Dim, Shape, nameable
from worker.engine.kernels.ops import BROADCASTING_OPS, SHAPE_INPUTS
from worker.engine.limits import GENERATORS, SIZED_BY_VALUE, Limits, describe_node, elements_from_values
from worker.engine.mirserve_domain.ops import DOMAIN, VERSION as DOMAIN_VERSION, get_op

#: Largest tensor (in elements) whose value type inference computes to learn shapes.
MAX_EVALUATED = 4096
#: Rounds of onnx's inference and value propagation, while a round learns a value the one before did not.
#: A chain of shape-dependent ops learns one link per round (swin_v2's shifted-window Pads, each sized from
#: the last one's output through a Mod onnx does not evaluate: 17 rounds; at 6, 238 of its nodes stayed).
MAX_ROUNDS = 64
#: Input slots whose values (not only shapes) decide an output's shape.
VALUE_SHAPED = {**SHAPE_INPUTS, "Loop": frozenset({0, 1}), "If": frozenset({0}), "Compress": frozenset({1}),
                "NonZero": frozenset({0}), "Upsample": frozenset({1})}


def apply_input_shapes(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> None:
    """Fix the shapes of graph inputs, refusing names the model lacks and dims that contradict it."""
    inputs = {v.name: v for v in graph.inputs if not v.is_initializer}
    for name, dims in shapes.items():
        value = inputs.get(name)
        if value is None:
            raise OptionsError(f"input shape given for {name!r}, but the model's inputs are "
                               f"{', '.join(repr(n) for n in inputs) or 'none'}", field="input_shapes")
        dims = tuple(int(d) for d in dims)
        if value.shape is not None and len(value.shape) != len(dims):
            raise OptionsError(f"input shape of {name!r} has {len(dims)} dims, the model declares rank "
                               f"{len(value.shape)} ({_show(value.shape)})", field="input_shapes")
        for axis, (declared, given) in enumerate(zip(value.shape or dims, dims)):
            if isinstance(declared, int) and declared != given:
                raise OptionsError(f"input shape of {name!r}: dim {axis} is {declared} in the model, "
                                   f"{given} given", field="input_shapes")
        value.shape = dims


def _show(shape: Shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def infer_types(model: Model, limits: Limits = Limits()) -> dict:
    """Type every value of ``model`` from its input shapes; returns the coverage figures for the trace.

    Raises LimitError before onnx's inference (or any evaluation) would create a tensor beyond ``limits``,
    and for a loop that only a trip count beyond them ends."""
    figures: dict = {}
    known: dict[str, np.ndarray] = {}
    declared: dict = {}

    def infer_with_onnx() -> str | None:
        nonlocal declared
        named = _named_shapes(model.graph)
        declared = _declared(named)
        return _infer_with_onnx(model, known, named)

    rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):
        check_sized_by_value(model.graph, known, limits)
        error = infer_with_onnx()
        for _ in range(MAX_ROUNDS):  # a relaxed carried value retypes its body, which may relax another
            if not _relax_carried(model.graph):
                break
            error = infer_with_onnx() or error
        for _ in range(DECLARING_RUNS):  # a name learned in a run lets the next declare what reads it
            if _declared(_named_shapes(model.graph)) == declared:
                break
            error = infer_with_onnx() or error
        _name_through(model)
        if error:
            figures["onnx_inference_error"] = error
        _infer_loop_outputs(model.graph, known)
        _forget_runtime_shapes(model)
        check_generated(model.graph, known, limits)
        if not _propagate_values(model.graph, known, model.opset(""), limits):
            break
    figures.update(_coverage(model.graph), rounds=rounds, evaluated_values=len(known))
    return figures


def _known_value(value: Value | None, known: dict[str, np.ndarray]) -> np.ndarray | None:
    """The value's data when type inference knows it (computed, or a small constant), else None."""
    if value is None:
        return None
    data = known.get(value.name)
    if data is None and (value.numel() is None or value.numel() <= MAX_EVALUATED):
        data = value.constant_value()
    return data if data is None or data.size <= MAX_EVALUATED else None


def _itemsize(value: Value) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.dtype)).itemsize if value.dtype else 1
    except (KeyError, TypeError, ValueError):
        return 1


def check_sized_by_value(graph: Graph, known: dict[str, np.ndarray], limits: Limits) -> None:
    """Refuse an op sized by values (ConstantOfShape, Range, Expand, Tile) whose known inputs ask for a tensor
    beyond the limits, before onnx's inference (whose data propagation materialises such values) sees it."""
    for body in graph.all_graphs():
        for op_type in SIZED_BY_VALUE:
            for node in body.nodes_of_type(op_type):
                data = node.input(0)
                values = [_known_value(v, known) for v in node.inputs]
                shape = data.shape if data is not None and data.is_static else None
                count = elements_from_values(op_type, shape, values)
                if count is not None:
                    limits.check_tensor(describe_node(node), count, _itemsize(node.outputs[0]))


def check_generated(graph: Graph, known: dict[str, np.ndarray], limits: Limits) -> None:
    """Refuse a generator (Resize, Pad, Expand, a Loop's scan outputs, ...) whose inferred static output is
    beyond the tensor limits, and a Loop that only a trip count beyond the limit ends."""
    for body in graph.all_graphs():
        for node in body:
            if node.op_type not in GENERATORS or node.domain:
                continue
            if node.op_type == "Loop" and node.attr("body") is not None:
                trips = _trip_count(node, node.attr("body"), known)
                if trips is not None:
                    limits.check_loop(describe_node(node), trips)
            for value in node.outputs:
                if value.is_static:
                    limits.check_tensor(describe_node(node), value.shape, _itemsize(value))


@contextmanager
def types_at(model: Model, shapes: Mapping[str, Sequence[int]], limits: Limits = Limits()) -> Iterator[None]:
    """Within the block, every value is typed as it would be with these input shapes (an analysis at one size
    of a model whose dims are open: the memory plan at sample sizes); on exit every type is as before."""
    saved = [(value, value.dtype, value.shape, value.type_proto)
             for graph in model.graph.all_graphs() for value in graph.values()]
    key = id(model)
    outermost = key not in _FROZEN
    if outermost and not any(True for _ in model.graph.all_graphs() if _ is not model.graph):
        _FROZEN[key] = None  # the graph does not change inside: its proto is written once (see _inference_proto)
    try:
        apply_input_shapes(model.graph, shapes)
        infer_types(model, limits)
        yield
    finally:
        for value, dtype, shape, type_proto in saved:
            value.dtype, value.shape, value.type_proto = dtype, shape, type_proto
        if outermost:
            _FROZEN.pop(key, None)


@contextmanager
def shapes_as(model: Model, found: Mapping[Value, Shape]) -> Iterator[None]:
    """Within the block, each value of ``found`` has that shape (types at a size known without inferring
    them: the memory plan's scaled shapes); on exit every shape is as before."""
    saved = [(value, value.shape) for value in found]
    try:
        for value, shape in found.items():
            value.shape = shape
        yield
    finally:
        for value, shape in saved:
            value.shape = shape


#: Models inside ``types_at`` (by id), with the proto onnx's inference reads once it is written. The block only
#: retypes values, so the nodes and small initializers stay as written; each use refreshes the top-level inputs'
#: and outputs' types. The memory plan types a model at eight sizes, three inference rounds each, and writing the
#: proto was a fifth of its time. Models with subgraphs (whose bodies declare typed inputs) are written each time.
_FROZEN: dict[int, onnx.ModelProto | None] = {}


def _inference_proto(model: Model) -> onnx.ModelProto:
    """The model without weights or value_info, as onnx's shape inference reads it: a fresh proto to edit."""
    key = id(model)
    if key not in _FROZEN:
        return model_to_proto(model, with_weights=False, value_info=False)
    if _FROZEN[key] is None:
        _FROZEN[key] = model_to_proto(model, with_weights=False, value_info=False)
    proto = onnx.ModelProto()
    proto.CopyFrom(_FROZEN[key])
    graph = model.graph
    for info in proto.graph.input:
        value = graph.value(info.name)
        if value is not None and value.is_graph_input:
            info.CopyFrom(value_info_proto(value))
    for info, value in zip(proto.graph.output, graph.outputs):
        info.CopyFrom(value_info_proto(value))
    return proto


def _infer_with_onnx(model: Model, known: dict[str, np.ndarray],
                     named: dict[Value, tuple[int, Shape]]) -> str | None:
    """One run of onnx's inference, with the known values substituted and ``named`` (``_named_shapes``)
    declared; merges what it finds into the IR's types. Returns its error, if it failed."""
    proto = _inference_proto(model)
    _forget_output_shapes(proto.graph)
    _substitute_known(proto.graph, known)
    _cut_runtime_shapes(model, proto.graph)
    for value, (dtype, shape) in named.items():
        _declare(proto.graph, value.name, dtype, shape)
    try:
        inferred = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # inference of some op failed: keep what we have and say so
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    types: dict[str, onnx.TypeProto] = {}
    _collect_types(inferred.graph, types)
    fresh = _fresh_symbols(model.graph)
    for graph in model.graph.all_graphs():
        for value in graph.values():
            found = types.get(value.name)
            if found is not None and not value.is_initializer and not value.is_graph_input:
                dtype, shape, other = type_from_proto(found)
                _merge(value, dtype, None if shape is None else tuple(fresh(d) for d in shape), other)
    return None


def _fresh_symbols(graph: Graph):
    """Renames for the dims onnx makes up in one inference run (``unk__0``, ``unk__1``, ... each run afresh):
    a name a value already holds from an earlier run would say two different dims are one (the batch of one
    run and a width of the next, both ``unk__2``), which onnxruntime takes for equal sizes. Within a run the
    same made-up name stays one name."""
    taken = {d for g in graph.all_graphs() for v in g.values() if v.shape for d in v.shape
             if isinstance(d, str) and d.startswith(MADE_UP)}
    numbers = [int(d[len(MADE_UP):]) for d in taken if d[len(MADE_UP):].isdigit()]
    counter = [max(numbers, default=-1) + 1]
    renamed: dict[str, str] = {}

    def fresh(dim: Dim) -> Dim:
        if not isinstance(dim, str) or not dim.startswith(MADE_UP) or dim not in taken:
            return dim
        if dim not in renamed:
            renamed[dim] = f"{MADE_UP}{counter[0]}"
            counter[0] += 1
        return renamed[dim]

    return fresh


#: Ops whose output has their first input's shape by their definition, where onnx's inference (through the
#: op's function body) leaves the dims it cannot name unknown: RotaryEmbedding's Y is X's shape.
SAME_SHAPE = frozenset({("", "RotaryEmbedding")})
#: Ops that pass a scalar shape value on unchanged, between a Shape's Gather and where it is used.
SCALAR_PASSING = frozenset({"Cast", "Squeeze", "Unsqueeze", "Identity"})


def _named_shapes(graph: Graph) -> dict[Value, tuple[int, Shape]]:
    """The shapes onnx's inference cannot name but whose dims are known to be a name of the model's, to declare
    before it runs, so that it passes the names on to what reads them (the batch and sequence of a dynamic
    export), with their element types:

    - the output of each ``SAME_SHAPE`` op has its input's shape;
    - ``Range(0, n, 1)`` where n is a dim of another value read by Shape -> Gather has that dim as its length
      (the positions of a sequence: ``torch.arange(x.size(1))``, whose rows a position embedding gathers and
      every attention layer then multiplies with its queries and keys). onnx's data propagation does not go
      through Range, so without this its length is a new ``unk__N`` and so is every dim broadcast with it;
    - the output of mirserve's attention ops is the queries' shape with the values' last dim, where the inputs'
      shapes prove it (onnx's inference through the op's function body names none of a symbolic sequence).

    Only names of the model's are declared (``_declare``): the ``unk__N`` of our types are renamed by each
    inference run."""
    found = {}
    for node in graph:
        shape = _named_output(node)
        if shape is not None:
            found[node.outputs[0]] = (node.outputs[0].dtype or node.input(0).dtype, shape)
    return found


def _named_output(node) -> Shape | None:
    """The shape of ``node``'s first output by the rules of ``_named_shapes``, or None."""
    if node.domain not in ("", "mirserve") or not node.outputs or node.input(0) is None:
        return None
    out = node.outputs[0]
    if out is None or out.type_proto is not None:
        return None
    if (node.domain, node.op_type) in SAME_SHAPE:
        source = node.input(0)
        return source.shape if source.shape is not None and source.dtype else None
    if node.domain == "mirserve" and node.op_type in ATTENTION_OPS:
        return _attention_shape(node) if node.input(0).dtype else None
    if not out.dtype:
        return None
    if node.op_type == "Range" and len(node.inputs) == 3:
        start, delta = (_scalar_constant(node.input(i)) for i in (0, 2))
        length = _named_dim(node.input(1))
        return (length,) if start == 0 and delta == 1 and length is not None else None
    if node.op_type == "Slice":
        return _clamped_slice(node)
    if node.op_type == "Reshape" and len(node.inputs) == 2:
        return _reshaped(node)
    if (node.op_type in BROADCASTING_OPS or node.op_type == "Expand") and not node.domain:
        return _broadcast_of_clamped(node)
    return None


def _name_through(model: Model) -> None:
    """Carry the model's names through the main graph in one sweep, in order: a node whose outputs onnx left
    with made-up dims while every input is named is typed again from its inputs (the declarations above, or
    onnx's inference of that node alone, a domain op's through its function). Declarations chain (a head split
    names the heads' batch only once what it splits is named, and a deep model chains them layer after layer),
    and a whole run of onnx's inference per link would cost a run per layer."""
    graph, opset = model.graph, model.opset("")
    for node in graph:
        if node.domain not in ("", "mirserve") or node.subgraphs():
            continue
        unnamed = [v for v in node.outputs if v is not None and v.type_proto is None and v.shape is not None
                   and not _nameable_shape(v.shape)]
        if not unnamed or not all(v is None or (v.dtype and _nameable_shape(v.shape)) for v in node.inputs):
            continue
        declared = _named_output(node)
        found = {node.outputs[0]: declared} if declared is not None else _node_shapes(node, opset)
        for value in unnamed:
            shape = found.get(value)
            if shape is not None and len(shape) == len(value.shape):
                value.shape = tuple(_merge_dim(old, new) for old, new in zip(value.shape, shape))


def _node_shapes(node, opset: int) -> dict[Value, Shape]:
    """The output shapes onnx's inference gives ``node`` alone, from its inputs' types and constants."""
    proto = onnx.NodeProto(op_type=node.op_type, domain=node.domain, name=node.name)
    proto.input.extend(v.name if v is not None else "" for v in node.inputs)
    proto.output.extend(v.name if v is not None else "" for v in node.outputs)
    proto.attribute.extend(encode_attribute(attr) for attr in node.attributes.values())
    inputs = [v for v in node.inputs if v is not None]
    try:
        if node.domain == DOMAIN:
            inferred = _function_shapes(proto, inputs, opset)
        else:
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
            data = {v.name: numpy_helper.from_array(np.asarray(v.constant_value()), v.name)
                    for v in inputs if v.is_constant and (v.numel() or 0) <= MAX_EVALUATED}
            inferred = shape_inference.infer_node_outputs(
                schema, proto, {v.name: value_info_proto(v).type for v in inputs}, data,
                opset_imports=[onnx.helper.make_opsetid("", opset)])
    except Exception:  # onnx cannot infer this node alone (or raises for it): it keeps what it has
        return {}
    found = {}
    for value in node.outputs:
        if value is not None and value.name in inferred:
            _, shape, other = type_from_proto(inferred[value.name])
            if other is None and shape is not None:
                found[value] = shape
    return found


def _function_shapes(proto: onnx.NodeProto, inputs: list[Value], opset: int) -> dict[str, onnx.TypeProto]:
    """onnx's inference of one call of a domain op, through its function body, in a model of that call alone."""
    graph = onnx.helper.make_graph([proto], "call", [value_info_proto(v) for v in inputs],
                                   [onnx.ValueInfoProto(name=name) for name in proto.output if name])
    function = get_op(proto.op_type)
    if function is None:
        return {}
    model = onnx.helper.make_model(graph, functions=[function.function(opset)], opset_imports=[
        onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    inferred = shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    return {info.name: info.type for info in inferred.graph.output if info.type.HasField("tensor_type")}


def _nameable_shape(shape: Shape | None) -> bool:
    return shape is not None and all(nameable(d) for d in shape)


def _reshaped(node) -> Shape | None:
    """The output shape of a Reshape whose target holds numbers, copies (0) and named dims (``dims_vector``),
    where its -1 comes out as a number or a product of the model's names: the input's dims over the target's
    others (``view(b, -1, heads, d)`` of a (b, s, heads * d) projection is (b, s, heads, d); ``view(s, -1, 64)``
    of (s, batch, 768) is (s, 12*batch, 64), named as torch's exporter names it, and ``view(-1, 12, s, 64)`` of
    that is (batch, 12, s, 64) again). onnx's inference does no arithmetic on names, so it makes the -1 up."""
    data, target = node.input(0).shape, dims_vector(node.input(1))
    allowzero = node.attr("allowzero", 0) != 0
    if data is None or target is None or target.count(-1) > 1 or not all(nameable(d) for d in data):
        return None
    dims: list[Dim] = []
    for position, dim in enumerate(target):
        if dim == 0 and not allowzero:
            if position >= len(data):
                return None
            dim = data[position]
        dims.append(dim)
    if -1 not in dims:
        return tuple(dims)
    whole = _product(data)
    others = _product(d for d in dims if d != -1)
    if whole is None or others is None:
        return None
    (number, names), (divisor, taken) = whole, others
    left = list(names)
    for name in taken:
        if name not in left:
            return None  # a name the input does not hold: no cancelling
        left.remove(name)
    if divisor == 0 or number % divisor:
        return None
    dims[dims.index(-1)] = product_name(number // divisor, left)
    return tuple(dims)


def factors(dim: Dim) -> tuple[int, list[str]] | None:
    """``dim`` as a number times names: ``12*batch`` is (12, [batch]), ``seq`` (1, [seq]), 5 (5, []); None for
    an unknown dim or one onnx made up. A name that is more than a product (``2*s0 + 1``) is one name."""
    if isinstance(dim, int):
        return dim, []
    if not nameable(dim):
        return None
    parts = dim.split("*")
    if len(parts) == 1 or not all(p.isdigit() or p.isidentifier() for p in parts):
        return 1, [dim]
    number, names = 1, []
    for part in parts:
        if part.isdigit():
            number *= int(part)
        else:
            names.append(part)
    return number, names


def _product(dims) -> tuple[int, list[str]] | None:
    number, names = 1, []
    for dim in dims:
        found = factors(dim)
        if found is None:
            return None
        number *= found[0]
        names.extend(found[1])
    return number, names


def product_name(number: int, names: Sequence[str]) -> Dim:
    """The dim ``number`` times ``names``, named as torch's exporter names one (``12*batch``, ``batch*seq``):
    the number first, then the names in order, so that one product has one name."""
    if not names:
        return number
    return "*".join(([str(number)] if number != 1 else []) + sorted(names))


def _clamp_name(dim: str, size: int) -> str:
    """The name of ``min(dim, size)``: what ``x[:, :n]`` of a constant of ``size`` rows keeps, n a dim named
    ``dim`` (BERT's ``position_ids[:, :seq]``, of a buffer of max_position_embeddings)."""
    return f"min({dim},{size})"


def _clamped_slice(node) -> Shape | None:
    """The shape of ``Slice(data, [0], ends=[n], [axis], [1])`` where n is a named dim of the model's and data's
    size C along the axis is known: that axis is ``min(n, C)`` (``_clamp_name``), the other dims data's own.
    onnx's inference leaves the length of a slice to a symbolic end unknown, and so every dim broadcast with
    it; ``_broadcast_of_clamped`` names those."""
    if len(node.inputs) < 3 or node.input(0) is None or node.input(0).shape is None:
        return None
    data = node.input(0).shape
    starts = node.input(1).constant_value() if node.input(1) is not None else None
    axes = node.input(3).constant_value() if len(node.inputs) > 3 and node.input(3) is not None else None
    steps = node.input(4).constant_value() if len(node.inputs) > 4 and node.input(4) is not None else None
    if starts is None or starts.size != 1 or int(starts.reshape(-1)[0]) != 0:
        return None
    if (steps is not None and (steps.size != 1 or int(steps.reshape(-1)[0]) != 1)) or \
            (len(node.inputs) > 4 and node.input(4) is not None and steps is None):
        return None
    if len(node.inputs) > 3 and node.input(3) is not None and (axes is None or axes.size != 1):
        return None
    axis = int(axes.reshape(-1)[0]) if axes is not None else 0
    if not -len(data) <= axis < len(data):
        return None
    axis %= len(data)
    end = _named_dim(node.input(2))
    size = data[axis]
    if end is None or not isinstance(size, int) or size < 1:
        return None
    return tuple(_clamp_name(end, size) if i == axis else d for i, d in enumerate(data))


def _clamped_of(dim: Dim) -> str | None:
    """The dim whose clamp ``dim`` is (``_clamp_name``), or None."""
    if isinstance(dim, str) and dim.startswith("min(") and dim.endswith(")") and "," in dim:
        return dim[4:dim.rindex(",")]
    return None


def _broadcast_of_clamped(node) -> Shape | None:
    """The output shape of a broadcasting op (or Expand, whose target shape is read off a Concat of dims) where
    one of its axes broadcasts a dim n with ``min(n, C)``: that axis is n. Were ``min(n, C)`` not n, it would
    be C < n, which broadcasts with n only where C is 1, and then n is 1 too; so in every run that succeeds the
    axis is n. None where no axis is such (onnx's inference names the rest), but for an Expand whose every dim
    is known: onnx does not read a target computed through TorchScript's Where (BART's
    ``positions.expand(batch, -1)``)."""
    if node.op_type == "Expand":
        target = dims_vector(node.input(1)) if len(node.inputs) > 1 else None
        shapes = [node.input(0).shape, target]
    else:
        shapes = [v.shape if v is not None else None for v in node.inputs]
    if not shapes or any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out, clamped = [], False
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if not dims:
            out.append(1)
        elif len(dims) == 1:
            out.append(dims.pop())
        else:
            names = {_clamped_of(d) or d for d in dims}
            if len(names) == 1 and nameable(next(iter(names))) and not isinstance(next(iter(names)), int):
                out.append(names.pop())
                clamped = True
            else:
                out.append(None)
    if any(isinstance(d, int) and d < 0 for d in out):
        return None  # a -1 the exporter's Where did not replace: no shape, and the runtime refuses the model
    if node.op_type == "Expand" and None not in out:  # onnx reads no target computed through a Where
        return tuple(out)
    return tuple(out) if clamped else None


#: Ops that pass a vector on unchanged when it stays a vector (TorchScript reshapes its sizes to [-1]).
VECTOR_PASSING = frozenset({"Reshape", "Identity", "Cast", "Squeeze", "Unsqueeze"})


def dims_vector(value: Value | None, depth: int = 0) -> Shape | None:
    """The dims a shape vector holds where each is a constant or a named dim (``_named_dim``): a constant
    vector, a Concat of such pieces (TorchScript's ``expand(x.size(0), x.size(1))``), or TorchScript's
    ``Where(Equal(v, -1), 1, v)`` of one (a dim is never negative, so it is v); None otherwise."""
    if value is None or depth > 4:
        return None
    data = value.constant_value()
    if data is not None:
        return tuple(int(x) for x in data.reshape(-1)) if data.ndim == 1 and data.dtype.kind in "iu" else None
    node = value.producer
    if node is not None and not node.domain and node.op_type == "Where" and len(node.inputs) == 3:
        return _never_negative_choice(node, depth)
    if node is not None and not node.domain and node.op_type in VECTOR_PASSING and node.input(0) is not None \
            and len(node.input(0).shape or ()) == 1 and len(value.shape or ()) == 1 \
            and (node.op_type != "Cast" or node.attr("to") in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)):
        return dims_vector(node.input(0), depth + 1)
    if node is None or node.domain or node.op_type != "Concat" or node.attr("axis", 0) != 0:
        return None
    dims: list[Dim] = []
    for piece in node.inputs:
        constant = piece.constant_value() if piece is not None else None
        if constant is not None and constant.ndim == 1 and constant.dtype.kind in "iu":
            dims.extend(int(x) for x in constant)
            continue
        if piece is not None and piece.producer is not None and piece.producer.op_type in ("Concat", "Where"):
            inner = dims_vector(piece, depth + 1)
            if inner is None:
                return None
            dims.extend(inner)
            continue
        name = _named_dim(piece) if piece is not None and piece.shape in ((1,), None) else None
        if name is None:
            return None
        dims.append(name)
    return tuple(dims)


def _never_negative_choice(where, depth: int) -> Shape | None:
    """``Where(Equal(v, c), x, v)`` with c negative and v's dims (``dims_vector``) named or non-negative: the
    condition is false everywhere, so it is v. A condition folded already (a constant) picks from both sides
    (BART's ``positions.expand(batch, -1)``: 1 where the -1 was)."""
    folded = where.input(0).constant_value()
    if folded is not None:
        sides = [dims_vector(where.input(i), depth + 1) for i in (1, 2)]
        if folded.ndim != 1 or any(s is None or len(s) != folded.size for s in sides):
            return None
        picked = tuple(a if bool(c) else b for c, a, b in zip(folded, *sides))
        return None if any(isinstance(d, int) and d < 0 for d in picked) else picked
    condition, chosen = where.input(0).producer, where.input(2)
    if condition is None or condition.domain or condition.op_type != "Equal" or len(condition.inputs) != 2:
        return None
    compared = {condition.input(0), condition.input(1)}
    if chosen not in compared:
        return None
    (other,) = compared - {chosen} or {None}
    negative = other.constant_value() if other is not None else None
    if negative is None or negative.size == 0 or negative.dtype.kind not in "iu" or not (negative < 0).all():
        return None
    dims = dims_vector(chosen, depth + 1)
    if dims is None or any(isinstance(d, int) and d < 0 for d in dims):
        return None
    return dims


#: Runs of onnx's inference after the first of a round, while the declarations they make keep changing (each
#: run can name what reads a value the run before named: an attention's output once its mask is named).
DECLARING_RUNS = 4


def _declared(named: dict[Value, tuple[int, Shape]]) -> dict[str, tuple]:
    """What declaring ``named`` writes, by value name: only the dims a declaration keeps."""
    return {value.name: (dtype, tuple(d if nameable(d) else None for d in shape))
            for value, (dtype, shape) in named.items()}


#: mirserve's attention ops (``worker/engine/mirserve_domain/fused.py``).
ATTENTION_OPS = frozenset({"ScaledDotProductAttention", "MultiHeadAttention"})


def _attention_shape(node) -> Shape | None:
    """The output shape of a mirserve attention op from its inputs' shapes, where they prove it: the batch dims
    of queries, keys and values are the same dims, the keys and values count the same positions, and a mask
    broadcasts to the scores without enlarging them (each of its dims 1 or the scores' own)."""
    q, k, v = (node.input(i).shape if node.input(i) is not None else None for i in range(3))
    mask = node.input(3).shape if len(node.inputs) > 3 and node.input(3) is not None else ()
    if q is None or k is None or v is None or mask is None:
        return None
    if node.op_type == "ScaledDotProductAttention":  # Q (..., s, d), KT (..., d, t), V (..., t, dv)
        if not len(q) == len(k) == len(v) >= 2 or not same_dims(q[:-2], k[:-2]) or not same_dims(q[:-2], v[:-2]) \
                or not same_dims(k[-1:], v[-2:-1]):
            return None
        scores = (*q[:-1], k[-1])
    else:  # MultiHeadAttention: Q (b, s, h*d), K (b, t, h*d), V (b, t, h*dv); scores (b, h, s, t)
        if not len(q) == len(k) == len(v) == 3 or not same_dims(q[:1], k[:1]) or not same_dims(q[:1], v[:1]) \
                or not same_dims(k[1:2], v[1:2]):
            return None
        scores = (q[0], node.attr("num_heads"), q[1], k[1])
    if len(mask) > len(scores) or not all(m == 1 or same_dims((m,), (s,))
                                          for m, s in zip(mask[::-1], scores[::-1])):
        return None
    return (*q[:-1], v[-1])


def same_dims(a: Shape, b: Shape) -> bool:
    """Dims known to be equal: the same number, or the same name of the model's."""
    return len(a) == len(b) and all(x is not None and x == y and not (isinstance(x, str) and x.startswith(MADE_UP))
                                    for x, y in zip(a, b))


def _declare(proto: onnx.GraphProto, name: str, dtype: int, shape: Shape) -> None:
    """``name`` declared with ``shape`` (its unnamed dims left open): a graph output's own type, any other
    value's value_info."""
    info = next((o for o in proto.output if o.name == name), None)
    if info is not None:
        info.type.tensor_type.ClearField("shape")
    else:
        info = proto.value_info.add(name=name)
    info.type.tensor_type.elem_type = dtype
    info.type.tensor_type.shape.SetInParent()
    for dim in shape:
        entry = info.type.tensor_type.shape.dim.add()
        if isinstance(dim, int):
            entry.dim_value = dim
        elif nameable(dim):
            entry.dim_param = dim


def _scalar_constant(value: Value | None) -> int | None:
    data = value.constant_value() if value is not None else None
    return int(data.reshape(-1)[0]) if data is not None and data.size == 1 and data.dtype.kind in "iu" else None


def _named_dim(value: Value | None) -> str | None:
    """The name (the model's, not onnx's) of the dim that the scalar ``value`` is: Shape(x) -> Gather(i), or
    the dynamo exporter's Shape(x, start=i, end=i + 1), then any of ``SCALAR_PASSING``, where dim i of x is that
    name; None otherwise."""
    for _ in range(8):
        node = value.producer if value is not None else None
        if node is None or node.domain:
            return None
        if node.op_type not in SCALAR_PASSING:
            break
        if node.op_type == "Cast" and node.attr("to") not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            return None
        value = node.input(0)
    else:
        return None
    if node.op_type == "Shape" and node.input(0).shape is not None:  # Shape(x, start=i, end=i + 1): dim i
        dims = node.input(0).shape[node.attr("start", 0):node.attr("end")]
        dim = dims[0] if len(dims) == 1 else None
        return dim if isinstance(dim, str) and not dim.startswith(MADE_UP) else None
    if node.op_type != "Gather" or node.attr("axis", 0) != 0:
        return None
    shape_node, index = node.input(0).producer, _scalar_constant(node.input(1))
    if shape_node is None or shape_node.op_type != "Shape" or shape_node.domain or index is None:
        return None
    dims = shape_node.input(0).shape
    if dims is None:
        return None
    dims = dims[shape_node.attr("start", 0):shape_node.attr("end")]
    if not -len(dims) <= index < len(dims):
        return None
    dim = dims[index]
    return dim if isinstance(dim, str) and not dim.startswith(MADE_UP) else None


def _forget_output_shapes(graph: onnx.GraphProto) -> None:
    """Graph outputs keep their dtype for inference; their declared shapes may be stale."""
    for output in graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")


def _substitute_known(graph: onnx.GraphProto, known: dict[str, np.ndarray]) -> None:
    """Nodes whose every output value is known become initializers, so inference sees their data."""
    if not known:
        return
    kept = []
    for node in graph.node:
        outputs = [o for o in node.output if o]
        if outputs and all(o in known for o in outputs):
            graph.initializer.extend(numpy_helper.from_array(known[o], o) for o in outputs)
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)


def _collect_types(graph: onnx.GraphProto, types: dict[str, onnx.TypeProto]) -> None:
    for info in list(graph.value_info) + list(graph.output):
        types[info.name] = info.type
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _collect_types(attr.g, types)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for body in attr.graphs:
                    _collect_types(body, types)


def _merge(value: Value, dtype: int, shape: Shape | None, other) -> None:
    if other is not None:
        value.type_proto = other
        return
    if dtype:
        value.dtype = dtype
    if shape is None:
        return
    if value.shape is None or len(value.shape) != len(shape):
        value.shape = shape
        return
    value.shape = tuple(_merge_dim(old, new) for old, new in zip(value.shape, shape))


def _merge_dim(old: Dim, new: Dim) -> Dim:
    """Static beats symbolic beats unknown; a name from the model beats one onnx made up (unk__N)."""
    if isinstance(new, int):
        return new
    if isinstance(old, int):
        return old
    if isinstance(new, str) and not new.startswith("unk__"):
        return new
    return old if old is not None else new


#: Reductions whose output shape onnxruntime does not compute as onnx infers it when the input is empty: it
#: gives back the input's shape ([0, 2] reduced over its last axis: [0, 2], where onnx says [0, 1]).
REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})


def _runtime_shaped(model: Model) -> list:
    """Nodes of the main graph whose output shape onnx infers but the runtime does not compute."""
    found = []
    for node in model.graph:
        data = node.input(0)
        if node.domain or node.op_type not in REDUCTIONS or data is None or data.shape is None:
            continue
        if any(d == 0 for d in data.shape):  # onnxruntime: [0, 2] -> [0, 2] over axis 1, [0] -> [0] over axis 0
            found.append(node)
    return found


def _cut_runtime_shapes(model: Model, graph: onnx.GraphProto) -> None:
    """Such nodes' outputs reach onnx's inference as graph inputs of unknown shape, so nothing downstream
    takes onnx's shape for them either."""
    cut = {node.output(0).name: node.input(0).dtype for node in _runtime_shaped(model) if node.input(0).dtype}
    if not cut:
        return
    kept = [n for n in graph.node if not any(o in cut for o in n.output)]
    del graph.node[:]
    graph.node.extend(kept)
    # a reduction keeps its input's element type
    graph.input.extend(onnx.helper.make_tensor_value_info(name, dtype, None) for name, dtype in cut.items())


def _forget_runtime_shapes(model: Model) -> None:
    """Shapes onnx infers but the runtime (which verification compares against) does not compute: left
    unknown, so that no rewrite relies on them."""
    for node in _runtime_shaped(model):
        node.output(0).shape = None


def _infer_loop_outputs(graph: Graph, known: dict[str, np.ndarray]) -> None:
    """Shapes onnx leaves out: a carried value whose body keeps its static shape keeps it after the loop,
    and a scan output of a loop that only the trip count can stop is [trip count] + the body's shape."""
    for body_graph in list(graph.all_graphs()):
        for node in body_graph.nodes_of_type("Loop"):
            body = node.attr("body")
            carried = len(node.inputs) - 2
            for i in range(min(carried, len(node.outputs))):
                initial, inside = node.input(2 + i), body.outputs[1 + i]
                if initial is not None and initial.is_static and inside.is_static \
                        and initial.shape == inside.shape and initial.dtype == inside.dtype:
                    _merge(node.outputs[i], initial.dtype, initial.shape, None)
            trips = _trip_count(node, body, known)
            for k, out in enumerate(node.outputs[carried:]):
                inside = body.outputs[1 + carried + k]
                if trips is not None and inside.is_static:
                    _merge(out, inside.dtype, (trips, *inside.shape), None)


def _relax_carried(graph: Graph) -> bool:
    """Loosen what a Loop or Scan body declares of a carried value to what holds on every iteration: a dim
    stays only where the initial value, the declaration and what the body makes of it agree. The TorchScript
    exporter declares an accumulator its first iteration's shape (Mask R-CNN's pasted masks: float[0,320,320],
    one more row a trip), and a rewrite that trusted the 0 dropped the Concat that appends to it. The body's
    values are typed again from the loosened inputs (their old dims cleared: a merge keeps static dims).
    Returns whether anything changed."""
    changed = False
    for owner in list(graph.all_graphs()):
        for node in list(owner):
            body = node.attr("body") if node.op_type in ("Loop", "Scan") and not node.domain else None
            if body is None:
                continue
            if node.op_type == "Loop":
                pairs = [(node.input(2 + i), body.inputs[2 + i], body.outputs[1 + i])
                         for i in range(min(len(node.inputs) - 2, len(body.inputs) - 2, len(body.outputs) - 1))]
            else:
                states = len(node.inputs) - int(node.attr("num_scan_inputs", 0))
                pairs = [(node.input(i), body.inputs[i], body.outputs[i])
                         for i in range(min(states, len(body.inputs), len(body.outputs)))]
            relaxed = False
            for initial, inside, made in pairs:
                shape = _carried_shape(inside.shape, initial.shape if initial is not None else None, made.shape)
                if shape != inside.shape:
                    inside.shape, relaxed = shape, True
            if relaxed:
                for inner in body.all_graphs():
                    for value in inner.values():
                        if not value.is_graph_input and not value.is_initializer:
                            value.shape = None
                changed = True
    return changed


def _carried_shape(declared: Shape | None, initial: Shape | None, made: Shape | None) -> Shape | None:
    if declared is None:
        return None
    if made is None or len(made) != len(declared):
        return tuple(None for _ in declared)
    return tuple(d if d is not None and made[k] == d and (initial is None or len(initial) != len(declared)
                                                          or initial[k] == d) else None
                 for k, d in enumerate(declared))


def _trip_count(node, body: Graph, known: dict[str, np.ndarray]) -> int | None:
    """The number of iterations when only the trip count ends the loop, else None."""
    count = node.input(0)
    if count is None:
        return None
    data = known.get(count.name)
    data = count.constant_value() if data is None else data
    if data is None:
        return None
    condition = node.input(1)
    start_true = condition is None or (condition.constant_value() is not None
                                       and bool(np.asarray(condition.constant_value()).reshape(-1)[0]))
    body_cond = body.outputs[0]
    passthrough = body_cond is body.inputs[1] or (
        body_cond.producer is not None and body_cond.producer.op_type == "Identity"
        and body_cond.producer.input(0) is body.inputs[1])
    return int(np.asarray(data).reshape(-1)[0]) if start_true and passthrough else None


def _shape_sources(graph: Graph) -> set[Value]:
    """The values some output shape depends on by value: read where an op takes a shape, axes, sizes or a
    condition, and everything they are computed from. Evaluating anything else (a weight's DequantizeLinear,
    say) would teach onnx's inference nothing."""
    needed: set[Value] = set()
    for node in graph:
        slots = VALUE_SHAPED.get(node.op_type, ()) if node.domain == "" else ()
        needed.update(node.input(slot) for slot in slots if node.input(slot) is not None)
    for node in reversed(list(graph)):
        if node.op_type in ("Shape", "Size") and node.domain == "":
            continue  # they read their input's shape, not its value
        if any(v in needed for v in node.outputs) or node.subgraphs():
            needed.update(v for v in node.inputs if v is not None)
    return needed


def _propagate_values(graph: Graph, known: dict[str, np.ndarray], opset: int, limits: Limits) -> int:
    """Evaluate nodes whose inputs are known and small and whose outputs shapes depend on; returns how many
    values became known."""
    learned = 0
    needed = _shape_sources(graph)
    for node in graph:
        if not any(v in needed for v in node.outputs) or all(v.name in known or not v.is_used for v in node.outputs):
            continue
        inputs = _known_inputs(node, known)
        if inputs is None or not _small_enough(node, inputs) or not _loop_bounded(node, inputs, limits):
            continue
        outputs = evaluate(node, inputs, opset, runtime=True)  # values the runtime would compute
        if outputs is None or len(outputs) < len(node.outputs):
            continue
        for value, array in zip(node.outputs, outputs):
            if array.size <= MAX_EVALUATED and value.name not in known:
                known[value.name] = array
                # A Constant's value is no news to onnx's inference: only computed values warrant a round.
                learned += node.op_type != "Constant"
                if not value.dtype:
                    value.dtype = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
                value.shape = tuple(int(d) for d in array.shape)
    return learned


def _known_inputs(node, known: dict[str, np.ndarray]) -> list | None:
    if node.op_type in ("Shape", "Size") and node.domain == "":
        source = node.input(0)
        if source is None or not source.is_static:
            return None
        return [np.empty(source.shape, dtype=np.uint8) if source.numel() <= MAX_EVALUATED
                else np.lib.stride_tricks.as_strided(np.empty(1, np.uint8), source.shape, [0] * len(source.shape))]
    inputs = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        array = known.get(value.name)
        if array is None:
            if value.numel() is not None and value.numel() > MAX_EVALUATED:
                return None
            array = value.constant_value()
        if array is None or array.size > MAX_EVALUATED:
            return None
        inputs.append(array)
    return inputs


def _small_enough(node, inputs: list) -> bool:
    """Bound the outputs of ops whose size comes from input values before computing them."""
    out = node.outputs[0]
    if out.numel() is not None:
        return out.numel() <= MAX_EVALUATED
    if node.op_type not in SIZED_BY_VALUE:
        return True
    size = elements_from_values(node.op_type, inputs[0].shape if inputs and inputs[0] is not None else None,
                                inputs)
    return size is not None and 0 <= size <= MAX_EVALUATED


def _loop_bounded(node, inputs: list, limits: Limits) -> bool:
    """A Loop is evaluated only with a known trip count within the limit: its condition may never turn false."""
    if node.op_type != "Loop":
        return True
    if not inputs or inputs[0] is None or np.asarray(inputs[0]).size != 1:
        return False
    return 0 <= int(np.asarray(inputs[0]).reshape(-1)[0]) <= limits.max_loop_trips


def _coverage(graph: Graph) -> dict:
    """How many values have a dtype and a fully static shape; the ones without a type, by name."""
    total = typed = static = 0
    untyped: list[str] = []
    symbolic: dict[str, None] = {}
    for body in graph.all_graphs():
        for value in body.values():
            total += 1
            if value.type_proto is not None:
                typed += 1
                continue
            if not value.dtype or value.shape is None:
                if value.is_used:
                    untyped.append(value.name)
                else:
                    total -= 1  # an unused optional output: nothing to type
                continue
            typed += 1
            if value.is_static:
                static += 1
            else:
                symbolic.update((d, None) for d in value.shape if isinstance(d, str))
    return {"values": total, "typed": typed, "static": static, "untyped": untyped,
            "symbolic_dims": list(symbolic)}
