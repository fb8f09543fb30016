"""Multiply-accumulate counts per node, as ncnnoptimize prints them for conv and fully connected layers.

Counts come from shapes alone: a convolution does one MAC per output element per weight element of its
filter slice, a transposed convolution one per input element per weight element of its slice, Gemm and
MatMul one per output element per element of the reduced dimension, Einsum one per output element per
element of its contracted indices, a recurrent layer one per step per weight of W and R, Attention one per
score (Q K^T) and one per weighted value. Bias adds, activations, pooling and normalizations are not MACs.
Quantized forms (``ConvInteger``, ``QLinearConv``, ``MatMulInteger``, ``QLinearMatMul``) count as the op
they quantize.

Every op gets an answer, never a silent 0:

- a standard op (``ai.onnx``, ``ai.onnx.ml``) has a counter above or does no counted MACs (0); the few whose
  definition does MACs that no counter above covers give None with the reason;
- an op defined by a function (every ``mirserve`` op: ``Fused<Op><Act>``, ``Nhwc<Op>``, ``QLinear<Op>``,
  the casts; and a model's own functions) counts as its body: the body is inlined for the node's shapes and
  attributes, onnx infers the shapes inside it, and its nodes are counted. The NHWC forms' transposes put
  data and weights back in NCHW order before the standard op, so the layout is taken into account by the
  body itself, and a node counts the same on every place;
- any other op, or a needed shape that is not known, gives None with the reason (``count_macs``).
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping, Sequence

from onnx import FunctionProto, TensorProto, defs, helper, inliner, shape_inference

Shape = Sequence[int | str | None]

#: Domains whose ops onnx defines (the host table holds every op of both).
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
MIRSERVE = "mirserve"


class Unknown(Exception):
    """A count that cannot be made; the message says why, as a sentence fragment."""


def _known(shape: Shape | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _shape(shapes: Sequence[Shape | None], slot: int, role: str) -> Sequence[int]:
    shape = shapes[slot] if slot < len(shapes) else None
    if not _known(shape):
        raise Unknown(f"the shape of its {role} (input {slot})", _shape_text(shape))
    return shape


def _shape_text(shape: Shape | None) -> str:
    """``missing``, or the dims with a symbolic dim by its name and an unknown one as ``?``."""
    return "missing" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _out(outputs, slot: int = 0) -> Sequence[int]:
    shape = outputs[slot] if slot < len(outputs) else None
    if not _known(shape):
        raise Unknown(f"the shape of its output {slot}", _shape_text(shape))
    return shape


def _conv(inputs, outputs, attributes, weight_slot: int = 1) -> int:
    """Output elements x (input channels per group x kernel elements) = prod(out) x prod(W[1:])."""
    weight, out = _shape(inputs, weight_slot, "weight"), _out(outputs)
    if len(weight) < 2:
        raise Unknown("its weight", f"rank {len(weight)}")
    return math.prod(out) * math.prod(weight[1:])


def _conv_transpose(inputs, outputs, attributes) -> int:
    """Each input element is scattered through its (output channels per group x kernel) weights."""
    data, weight = _shape(inputs, 0, "data"), _shape(inputs, 1, "weight")
    if len(weight) < 2:
        raise Unknown("its weight", f"rank {len(weight)}")
    return math.prod(data) * math.prod(weight[1:])


def _gemm(inputs, outputs, attributes) -> int:
    a, out = _shape(inputs, 0, "A"), _out(outputs)
    if len(a) != 2:
        raise Unknown("its input A", f"rank {len(a)}")
    reduced = a[0] if attributes.get("transA", 0) else a[1]
    return math.prod(out) * reduced


def _matmul(inputs, outputs, attributes, a_slot: int = 0) -> int:
    a, out = _shape(inputs, a_slot, "A"), _out(outputs)
    if not a:
        raise Unknown("its input A", "a scalar")
    return math.prod(out) * a[-1]


def _contrib_matmul(inputs, outputs, attributes) -> int:
    """com.microsoft MatMul forms; ``transA`` moves the reduced dimension of A to its second-last axis."""
    a, out = _shape(inputs, 0, "A"), _out(outputs)
    if not a:
        raise Unknown("its input A", "a scalar")
    return math.prod(out) * (a[-2] if attributes.get("transA", 0) and len(a) > 1 else a[-1])


def _nchwc_conv(inputs, outputs, attributes) -> int:
    """NCHWc blocked conv: output elements x weights per output channel (all blocks of the weight)."""
    weight, out = _shape(inputs, 1, "weight"), _out(outputs)
    channels = out[1] * out[-1] if len(out) == 5 else out[1]
    if not channels:
        return 0
    return math.prod(out) * math.prod(weight) // channels


def _einsum(inputs, outputs, attributes) -> int:
    """Output elements x contracted index space, once per operand after the first (0 for one operand)."""
    equation = attributes.get("equation")
    if isinstance(equation, bytes):
        equation = equation.decode()
    if not isinstance(equation, str):
        raise Unknown("its equation", "missing")
    if len(inputs) < 2:
        return 0
    out = _out(outputs)
    terms, arrow, result = equation.replace(" ", "").partition("->")
    sizes: dict[str, int] = {}
    for slot, term in enumerate(terms.split(",")):
        shape = _shape(inputs, slot, f"operand {slot}")
        letters = term.replace("...", "")
        if "..." in term:  # the letters after the ellipsis sit at the end of the shape
            before, after = term.split("...")
            pairs = list(zip(before, shape)) + list(zip(after, shape[len(shape) - len(after):]))
        else:
            pairs = list(zip(letters, shape))
        for letter, dim in pairs:
            sizes[letter] = max(sizes.get(letter, 1), dim)
    kept = set(result) if arrow else set()
    if not arrow:  # implicit output: the letters that occur once
        kept = {c for c in sizes if re.sub(r"[^a-zA-Z]", "", terms).count(c) == 1}
    contracted = math.prod(size for letter, size in sizes.items() if letter not in kept)
    return math.prod(out) * contracted * (len(inputs) - 1)


def _recurrent(inputs, outputs, attributes) -> int:
    """Every step of every sequence multiplies the input by W and the hidden state by R (all gates)."""
    x, w, r = _shape(inputs, 0, "X"), _shape(inputs, 1, "W"), _shape(inputs, 2, "R")
    if len(x) != 3:
        raise Unknown("its input X", f"rank {len(x)}")
    return x[0] * x[1] * (math.prod(w) + math.prod(r))


def _attention(inputs, outputs, attributes) -> int:
    """Scores Q K^T (one MAC per query element per key) and their weighted sum of V (per output element)."""
    q, k, y = _shape(inputs, 0, "Q"), _shape(inputs, 1, "K"), _out(outputs)
    present = outputs[1] if len(outputs) > 1 else None
    if _known(present) and len(present) == 4:
        keys = present[2]
    elif len(k) in (3, 4):
        keys = k[-2] if len(k) == 4 else k[1]
        past = inputs[4] if len(inputs) > 4 else None
        if past is not None:
            keys += _shape(inputs, 4, "past_key")[2]
    else:
        raise Unknown("its input K", f"rank {len(k)}")
    return (math.prod(q) + math.prod(y)) * keys


def _kv_length(inputs, outputs, present_slot: int, present_axis: int, key_slot: int, key_axis_3d: int,
               past_slot: int | None, past_axis: int) -> int:
    """Keys each query attends to: the present key's length when known, else the key's (plus the past's)."""
    present = outputs[present_slot] if len(outputs) > present_slot else None
    if _known(present) and len(present) > present_axis:
        return present[present_axis]
    key = _shape(inputs, key_slot, "key")
    length = key[key_axis_3d] if len(key) == 3 else key[-2]
    if past_slot is not None and len(inputs) > past_slot and inputs[past_slot] is not None:
        length += _shape(inputs, past_slot, "past key")[past_axis]
    return length


def _contrib_attention(inputs, outputs, attributes) -> int:
    """com.microsoft.Attention: the Q/K/V projection (X by its weights), then scores and weighted values."""
    x, w, y = _shape(inputs, 0, "input"), _shape(inputs, 1, "weights"), _out(outputs)
    if len(x) != 3 or len(w) != 2:
        raise Unknown("its input or weights", f"of ranks {len(x)} and {len(w)}")
    sizes = list(attributes.get("qkv_hidden_sizes") or [])
    q_hidden = sizes[0] if sizes else w[1] // 3
    present = outputs[1] if len(outputs) > 1 else None
    if _known(present) and len(present) == 5:
        keys = present[3]
    else:
        keys = x[1]
        if len(inputs) > 4 and inputs[4] is not None:
            keys += _shape(inputs, 4, "past")[3]
    return math.prod(x) * w[1] + x[0] * x[1] * keys * q_hidden + math.prod(y) * keys


def _multi_head_attention(inputs, outputs, attributes, grouped: bool = False) -> int:
    """com.microsoft.MultiHeadAttention / GroupQueryAttention (projected Q, K, V): one MAC per query element
    per key for the scores, one per output element per key for the weighted sum (query size = output size
    per head, as these ops require)."""
    out = _out(outputs)
    if grouped:  # GroupQueryAttention: present_key [B, kv_heads, T, H]; past_key input 3
        keys = _kv_length(inputs, outputs, 1, 2, 1, 1, 3, 2)
    else:  # MultiHeadAttention: present_key [B, heads, T, H]; past_key input 6
        keys = _kv_length(inputs, outputs, 1, 2, 1, 1, 6, 2)
    return 2 * math.prod(out) * keys


def _heads_layout_attention(inputs, outputs, attributes) -> int:
    """mirserve.MultiHeadAttention: Q (batch, seq, heads * size) against K (batch, keys, kv_heads * size):
    one MAC per query element per key for the scores, one per output element per key for the weighted sum
    (its body splits the heads with a Reshape whose target shape inference cannot follow)."""
    q, k, out = _shape(inputs, 0, "query"), _shape(inputs, 1, "key"), _out(outputs)
    if len(q) != 3 or len(k) != 3:
        raise Unknown("its query or key", f"of ranks {len(q)} and {len(k)}")
    return (math.prod(q) + math.prod(out)) * k[1]


Counter = Callable[[Sequence, Sequence, Mapping], int]

#: Standard ops that do counted MACs; QLinear* forms keep the weight (or B) after the scale and zero point
#: of the first input.
STANDARD_COUNTERS: dict[str, Counter] = {
    "Conv": _conv,
    "ConvInteger": _conv,
    "QLinearConv": lambda i, o, a: _conv(i, o, a, weight_slot=3),
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "MatMulInteger": _matmul,
    "QLinearMatMul": _matmul,
    "Einsum": _einsum,
    "RNN": _recurrent,
    "GRU": _recurrent,
    "LSTM": _recurrent,
    "Attention": _attention,
}

#: onnxruntime's contrib ops (the x86 and cuda tables hold them) that do MACs, by (domain, op).
CONTRIB_COUNTERS: dict[tuple[str, str], Counter] = {
    **{("com.microsoft", op): _conv for op in ("FusedConv",)},
    ("com.microsoft", "QLinearConv"): STANDARD_COUNTERS["QLinearConv"],
    ("com.microsoft", "ConvTransposeWithDynamicPads"): _conv_transpose,
    ("com.microsoft", "FusedGemm"): _gemm,
    ("com.microsoft", "QGemm"): _gemm,
    **{("com.microsoft", op): _contrib_matmul for op in (
        "FusedMatMul", "TransposeMatMul", "MatMulInteger16", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
        "MatMulNBits", "MatMulBnb4", "MatMulFpQ4")},
    ("com.microsoft.nchwc", "Conv"): _nchwc_conv,
    ("com.microsoft", "Attention"): _contrib_attention,
    ("com.microsoft", "MultiHeadAttention"): _multi_head_attention,
    ("com.microsoft", "GroupQueryAttention"): lambda i, o, a: _multi_head_attention(i, o, a, grouped=True),
}
#: mirserve ops counted by a rule rather than through their function body.
MIRSERVE_COUNTERS: dict[str, Counter] = {"MultiHeadAttention": _heads_layout_attention}
#: Contrib ops that do no counted MACs (elementwise, normalization, quantization, data movement, pooling).
CONTRIB_ZERO = frozenset({("com.microsoft", op) for op in (
    "BiasGelu", "BifurcationDetector", "CropAndResize", "DequantizeLinear", "DynamicTimeWarping",
    "EmbedLayerNormalization", "ExpandDims", "FastGelu", "GatedRMSNorm", "GatherBlockQuantized", "GatherND",
    "Gelu", "GridSample", "MRotaryEmbedding", "MaxpoolWithMask", "MurmurHash3", "NGramHashMapping",
    "NGramRepeatBlock", "NhwcMaxPool", "Pad", "QEmbedLayerNormalization", "QLinearAdd", "QLinearAveragePool",
    "QLinearConcat", "QLinearGlobalAveragePool", "QLinearLeakyRelu", "QLinearMul", "QLinearSigmoid",
    "QLinearSoftmax", "QLinearWhere", "QuantizeLinear", "QuickGelu", "Range", "RotaryEmbedding", "ScaledSiLU",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "Tokenizer", "Trilu", "UnfoldTensor",
    "Unique", "VarlenNGramHashMapping")} | {("com.microsoft.nchwc", op) for op in (
    "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "MaxPool", "ReorderInput", "ReorderOutput",
    "Upsample")} | {("", op) for op in (  # retired experimental ops and onnxruntime's own ops of the default
    "Affine", "Crop", "DynamicSlice", "ImageScaler", "ParametricSoftplus", "Scale", "ScaledTanh",  # domain
    "MemcpyFromHost", "MemcpyToHost", "SimplifiedLayerNormalization")})
#: Contrib ops that do MACs with no rule here (attention, recurrent, mixture-of-experts, search loops):
#: None, with the reason. Ops of these domains in neither list are unknown too.
CONTRIB_DOMAINS = ("com.microsoft", "com.microsoft.nchwc")

#: Standard ops that do MACs no counter here covers: None, with the reason, rather than a 0 that lies.
UNCOUNTED_STANDARD = frozenset({"LinearAttention", "FlexAttention", "CausalConvWithState", "AffineGrid",
                                "LinearClassifier", "LinearRegressor", "SVMClassifier", "SVMRegressor"})


#: Ops whose result depends on their inputs' shapes only: with what follows from them alone (the typed
#: scalars old-opset bodies build with EyeLike and a 1x1 Gemm), they compute constants, not per-run MACs.
VALUE_FREE = frozenset({"Constant", "Shape", "Size", "EyeLike", "ConstantOfShape"})


def base_op(op_type: str, domain: str) -> str | None:
    """The standard op whose counter counts ``op_type`` (standard domains only), or None."""
    if domain in ("", "ai.onnx"):
        return op_type if op_type in STANDARD_COUNTERS else None
    return None


def count_macs(op_type: str, domain: str, input_shapes: Sequence[Shape | None],
               output_shapes: Sequence[Shape | None], attributes: Mapping | None = None, *,
               input_types: Sequence[int] | None = None, opset: int | None = None,
               functions: Mapping[tuple[str, str], FunctionProto] | None = None) -> tuple[int | None, str | None]:
    """MACs of one node and, when they are None, why.

    ``input_types`` (onnx element types) and ``opset`` (of the default domain) are used to infer the shapes
    inside a function body; ``functions`` are the model's own functions by (domain, name), which take
    precedence over the ``mirserve`` ops this process defines.
    """
    attributes = attributes or {}
    kind = f"{domain}.{op_type}" if domain else op_type
    function = _function(op_type, domain, opset, functions)
    try:
        if domain in ("", "ai.onnx") and op_type in STANDARD_COUNTERS:
            return STANDARD_COUNTERS[op_type](input_shapes, output_shapes, attributes), None
        if domain == MIRSERVE and op_type in MIRSERVE_COUNTERS and not (functions and (domain, op_type) in functions):
            return MIRSERVE_COUNTERS[op_type](input_shapes, output_shapes, attributes), None
        if (domain, op_type) in CONTRIB_COUNTERS:
            return CONTRIB_COUNTERS[(domain, op_type)](input_shapes, output_shapes, attributes), None
        if (domain, op_type) in CONTRIB_ZERO:
            return 0, None
        if domain in STANDARD_DOMAINS and defs.has(op_type, "" if domain == "ai.onnx" else domain):
            if op_type in UNCOUNTED_STANDARD:
                return None, f"{kind} does MACs that mirserve has no rule to count"
            return 0, None
        if domain in CONTRIB_DOMAINS and function is None:
            return None, f"{kind} (an onnxruntime contrib op) may do MACs that mirserve has no rule to count"
        if function is not None:
            return _body_macs(function, input_shapes, attributes, input_types, opset, functions), None
    except Unknown as error:
        what, value = error.args
        return None, f"{kind}: {what} is {value}"
    return None, f"{kind} is neither a standard op nor defined by a function, so its MACs are unknown"


def node_macs(op_type: str, domain: str, input_shapes: Sequence[Shape | None],
              output_shapes: Sequence[Shape | None], attributes: Mapping | None = None, **context) -> int | None:
    """MACs of one node; 0 for ops that do none, None when unknown (``count_macs`` says why)."""
    return count_macs(op_type, domain, input_shapes, output_shapes, attributes, **context)[0]


def _function(op_type: str, domain: str, opset: int | None,
              functions: Mapping[tuple[str, str], FunctionProto] | None) -> FunctionProto | None:
    if functions and (domain, op_type) in functions:
        return functions[(domain, op_type)]
    if domain != MIRSERVE:
        return None
    return _mirserve_function(op_type, opset or _DEFAULT_OPSET)


_DEFAULT_OPSET = 17


_FUNCTIONS: dict[tuple[str, int], FunctionProto] = {}


def _mirserve_function(op_type: str, opset: int) -> FunctionProto | None:
    """The function of a mirserve op at ``opset`` (cached once found: an op is never redefined)."""
    key = (op_type, opset)
    if key not in _FUNCTIONS:
        function = _build_function(op_type, opset)
        if function is None:
            return None
        _FUNCTIONS[key] = function
    return _FUNCTIONS[key]


def _build_function(op_type: str, opset: int) -> FunctionProto | None:
    from worker.engine.mirserve_domain import fused  # noqa: F401 - defines the built-in ops
    from worker.engine.passes.support import casts  # noqa: F401 - defines io_copy, calib, layout
    from worker.engine.mirserve_domain import ops as domain
    op = domain.get_op(op_type)
    if op is None and op_type.startswith("Nhwc"):  # a model mirserve wrote, read by a fresh process
        from worker.engine.passes.support.nhwc import nhwc_form, register_nhwc
        base = op_type.removeprefix("Nhwc")
        form = nhwc_form(base, MIRSERVE if domain.get_op(base) else "", opset) if (
            domain.get_op(base) or defs.has(base)) else None
        op = register_nhwc(form) if form is not None else None
    if op is None:
        return None
    try:
        return op.function(opset)
    except Exception:  # noqa: BLE001 - a body that cannot be built at this opset is an unknown count
        return None


def _body_macs(function: FunctionProto, input_shapes, attributes: Mapping, input_types, opset,
               functions: Mapping[tuple[str, str], FunctionProto] | None = None) -> int:
    if not _may_do_macs(function, functions or {}, opset):
        return 0
    nested = _with_nested(function, opset, functions or {})
    key = (b"".join(f.SerializeToString() for f in nested),
           tuple(None if s is None else tuple(s) for s in input_shapes),
           tuple(input_types or ()), _frozen(attributes), opset)
    return _cached_body_macs(key, nested, input_shapes, attributes, input_types, opset)


_BODY_CACHE: dict[tuple, int | Unknown] = {}


def _cached_body_macs(key, nested, input_shapes, attributes, input_types, opset) -> int:
    if key not in _BODY_CACHE:
        if len(_BODY_CACHE) > 4096:
            _BODY_CACHE.clear()
        try:
            _BODY_CACHE[key] = _infer_body(nested, input_shapes, attributes, input_types, opset)
        except Unknown as error:
            _BODY_CACHE[key] = error
    result = _BODY_CACHE[key]
    if isinstance(result, Unknown):
        raise result
    return result


def _resolve(domain: str, op_type: str, opset: int | None,
             functions: Mapping[tuple[str, str], FunctionProto]) -> FunctionProto | None:
    """The function that defines a call: the model's own first, then the mirserve op of that name."""
    if (domain, op_type) in functions:
        return functions[(domain, op_type)]
    return _mirserve_function(op_type, opset or _DEFAULT_OPSET) if domain == MIRSERVE else None


def _may_do_macs(function: FunctionProto, functions: Mapping[tuple[str, str], FunctionProto],
                 opset: int | None, seen: frozenset = frozenset()) -> bool:
    """Whether any node of the body (nested function calls included) may count MACs."""
    seen = seen | {(function.domain, function.name)}
    for node in function.node:
        if node.domain in ("", "ai.onnx") and (node.op_type in STANDARD_COUNTERS
                                              or node.op_type in UNCOUNTED_STANDARD):
            return True
        if node.domain not in STANDARD_DOMAINS:
            inner = _resolve(node.domain, node.op_type, opset, functions)
            if inner is None or (node.domain, node.op_type) in seen or _may_do_macs(inner, functions, opset, seen):
                return True
    return False


def _frozen(attributes: Mapping) -> tuple:
    def freeze(value):
        if isinstance(value, (list, tuple)):
            return tuple(freeze(v) for v in value)
        if hasattr(value, "SerializeToString"):
            return value.SerializeToString()
        return value
    return tuple(sorted((name, freeze(value)) for name, value in attributes.items()))


def _infer_body(nested: list[FunctionProto], input_shapes, attributes: Mapping, input_types, opset) -> int:
    """Inline the function (``nested[0]``, with the functions it calls) for this call, infer the shapes
    inside, and count the nodes of the body."""
    function = nested[0]
    formals = list(function.input)
    for slot, shape in enumerate(input_shapes[:len(formals)]):
        if shape is not None and not _known(shape):
            raise Unknown(f"the shape of its input {slot}", _shape_text(shape))
    names = [f"in{slot}" if slot < len(input_shapes) and input_shapes[slot] is not None else ""
             for slot in range(len(formals))]
    while names and not names[-1]:
        names.pop()
    types = list(input_types or [])
    graph_inputs = [helper.make_tensor_value_info(name, types[slot] if slot < len(types) and types[slot]
                                                  else TensorProto.FLOAT, list(input_shapes[slot]))
                    for slot, name in enumerate(names) if name]
    outputs = [f"out{slot}" for slot in range(len(function.output))]
    call = helper.make_node(function.name, names, outputs, domain=function.domain)
    for name, value in attributes.items():
        if value is not None:
            call.attribute.append(helper.make_attribute(name, value))
    version = opset or next((o.version for o in function.opset_import if o.domain == ""), _DEFAULT_OPSET)
    graph = helper.make_graph([call], "macs", graph_inputs, [helper.make_value_info(o, helper.TypeProto())
                                                             for o in outputs])
    imports = {o.domain: o.version for o in function.opset_import}
    imports[""] = max(imports.get("", 0), version)
    for each in nested:
        for o in each.opset_import:
            imports.setdefault(o.domain, o.version)
        imports.setdefault(each.domain, 1)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in imports.items()],
                              functions=nested)
    try:
        inlined = inliner.inline_local_functions(model)
        model = shape_inference.infer_shapes(inlined)
    except Exception as error:  # noqa: BLE001 - onnx refuses the body: the count is unknown, with its words
        raise Unknown("its function body", f"not shape-inferable ({_first_line(error)})")
    shapes: dict[str, list[int] | None] = {}
    for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tensor = info.type.tensor_type
        shapes[info.name] = ([d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
                             if tensor.HasField("shape") else None)
    total = 0
    constant: set[str] = set()  # values whose contents no data input decides: computed once, not per run
    for node in model.graph.node:
        if node.op_type in VALUE_FREE or all(not n or n in constant for n in node.input):
            constant.update(node.output)
            continue
        inner_attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        count, reason = count_macs(node.op_type, node.domain, [shapes.get(n) if n else None for n in node.input],
                                   [shapes.get(n) for n in node.output], inner_attrs, opset=version)
        if count is None:
            try:  # onnx's own words for what does not fit, when it has them
                shape_inference.infer_shapes(inlined, strict_mode=True)
            except Exception as error:  # noqa: BLE001
                raise Unknown("its function body", f"not shape-inferable ({_first_line(error)})")
            raise Unknown("the body node " + (f"{node.domain}." if node.domain else "") + node.op_type,
                          f"uncounted ({reason})")
        total += count
    return total


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _with_nested(function: FunctionProto, opset: int | None,
                 functions: Mapping[tuple[str, str], FunctionProto]) -> list[FunctionProto]:
    """The function and every function its body calls (the model's own, mirserve ops), the function first, so
    the inliner can expand them all."""
    found, queue = {(function.domain, function.name): function}, [function]
    while queue:
        for node in queue.pop().node:
            key = (node.domain, node.op_type)
            if node.domain not in STANDARD_DOMAINS and key not in found:
                inner = _resolve(node.domain, node.op_type, opset, functions)
                if inner is not None:
                    found[key] = inner
                    queue.append(inner)
    return list(found.values())
