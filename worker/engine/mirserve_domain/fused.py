"""The fused ops of the ``mirserve`` domain: ``Fused<Base><Activation>`` and ``ChannelShuffle``.

Each is a model-local ONNX function whose body is the standard ops it replaces, so onnxruntime and
``onnx.reference`` still run the model. Every function attribute is required and the fusion passes always
write every one of them (with the standard op's default where the model left it out): ``onnx.reference``
refuses a call that omits a declared attribute, and a default written in the function is ignored by it.
For the same reason every input is always passed (a zero bias for a conv without one).

    FusedConv<Act>(X, W, B) -> Y           dilations, group, pads, strides (+ activation params)
    FusedConvTranspose<Act>(X, W, B) -> Y  dilations, group, output_padding, pads, strides
    FusedGemm<Act>(A, B, C) -> Y           alpha, beta, transA, transB
    FusedMatMul<Act>(A, B) -> Y
    FusedAdd<Act>(A, B) -> C
    Gelu(X), GeluTanh(X) -> Y             Gelu (opset 20) written out, for older opsets
    RMSNorm(X, scale) -> Y                 epsilon: RMSNormalization (opset 23) over the last axis
    ScaledDotProductAttention(Q, KT, V, mask) -> Y
                                           scale: Attention (opset 23) with the keys transposed
    MultiHeadAttention(Q, K, V, mask) -> Y num_heads, scale: the same over (batch, seq, heads * size) inputs
                                           split into heads and the output joined back (Attention's 3-D form)
    AddLayerNormalization(A, B, scale, bias) -> Y
    AddLayerNormalizationWithSum(A, B, scale, bias) -> Y, S
                                           axis, epsilon, stash_type: LayerNormalization (opset 17) of A + B,
                                           a transformer block's residual connection and norm; the second
                                           form also gives the sum S (a pre-norm block's next residual)
    ChannelShuffle(X) -> Y                 group: X [N, C, ...] seen as [N, group, C/group, ...], the two
                                           group axes swapped, and read back in X's shape
    QLinear<Op>(operands with scales and zero points, output scale and zero point[, B]) -> 8-bit result
                                           DequantizeLinear of each operand, <Op>, QuantizeLinear
                                           (worker.engine.kernels.ops.QLINEAR_FORMS lists the ops and inputs)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from typing import Callable

from onnx import AttributeProto

from worker.engine.mirserve_domain.ops import DomainOp, get_op, ref, register_op
from worker.engine.kernels.ops import QLINEAR_FORMS, QLinearForm
from worker.engine.mirserve_domain.activations import ACTIVATIONS, Activation
from worker.engine.mirserve_domain.body import BodyBuilder, UnsupportedOpset

A = AttributeProto
_CONV = {"dilations": A.INTS, "group": A.INT, "pads": A.INTS, "strides": A.INTS}


@dataclass(frozen=True)
class Base:
    """The op a fused op starts with."""

    name: str
    inputs: tuple[str, ...]
    output: str
    #: The base op's attributes, carried by the fused op under the same names.
    attributes: dict[str, int]


BASES: dict[str, Base] = {b.name: b for b in (
    Base("Conv", ("X", "W", "B"), "Y", _CONV),
    Base("ConvTranspose", ("X", "W", "B"), "Y", {**_CONV, "output_padding": A.INTS}),
    Base("Gemm", ("A", "B", "C"), "Y", {"alpha": A.FLOAT, "beta": A.FLOAT, "transA": A.INT, "transB": A.INT}),
    Base("MatMul", ("A", "B"), "Y", {}),
    Base("Add", ("A", "B"), "C", {}),
)}


def fused_name(base: str, activation: str) -> str:
    return f"Fused{base}{activation}"


def _fused_body(base: Base, activation: Activation, body: BodyBuilder) -> None:
    refs = tuple(ref(name, name, kind) for name, kind in base.attributes.items())
    pre = body.op(base.name, list(base.inputs), refs=refs)
    activation.emit(body, pre, base.output)


#: The per-channel axis a quantized form's weight (operand 1) may have; other operands are per-tensor.
QLINEAR_WEIGHT_AXIS = {"Conv": 0, "MatMul": 1}
#: Attributes a quantized form carries for its float op (every one written, as for the fused ops).
QLINEAR_ATTRIBUTES = {"Conv": _CONV}
#: Attributes a quantized form's body fixes instead. onnx.reference cannot pass a referenced attribute to
#: Softmax, so QLinearSoftmax is the softmax over the last axis (the same at every opset).
QLINEAR_FIXED = {"Softmax": {"axis": -1}}


def _qlinear_body(form: QLinearForm, body: BodyBuilder) -> None:
    """DequantizeLinear of each operand, the float op, QuantizeLinear: exactly the nodes it replaces."""
    body.require(10, form.name)
    floats = []
    for index, operand in enumerate(form.operands):
        axis = QLINEAR_WEIGHT_AXIS.get(form.op) if index == 1 and body.opset >= 13 else None
        extra = {} if axis is None or axis == 1 else {"axis": axis}  # 1 is DequantizeLinear's default
        floats.append(body.op("DequantizeLinear", [operand, f"{operand}_scale", f"{operand}_zero_point"], **extra))
    attributes = QLINEAR_ATTRIBUTES.get(form.op, {})
    refs = tuple(ref(name, name, kind) for name, kind in attributes.items())
    result = body.op(form.op, floats + (["B"] if form.bias else []), refs=refs, **QLINEAR_FIXED.get(form.op, {}))
    body.op("QuantizeLinear", [result, f"{form.output}_scale", f"{form.output}_zero_point"], out=form.output)


def _shuffle_body(body: BodyBuilder) -> None:
    body.require(9, "ChannelShuffle")
    shape = body.op("Shape", ["X"])
    batch = body.op("Gather", [shape, body.constant(np.array([0], dtype=np.int64))], axis=0)
    channels = body.op("Gather", [shape, body.constant(np.array([1], dtype=np.int64))], axis=0)
    groups = body.int_attribute("group", above=channels)
    per_group = body.op("Div", [channels, groups])
    split = body.op("Concat", [batch, groups, per_group, body.constant(np.array([-1], dtype=np.int64))], axis=0)
    swapped = body.op("Transpose", [body.op("Reshape", ["X", split])], perm=[0, 2, 1, 3])
    body.op("Reshape", [swapped, shape], out="Y")


#: Transformer ops the standard domain gained late (Gelu 20; RMSNormalization, Attention 23), as own-domain
#: ops with their chains as bodies, for models whose opset is older (transformer_domain_fuse). name ->
#: (inputs, attributes, description).
TRANSFORMER_OPS = {
    "Gelu": (("X",), {}, "0.5 * X * (1 + Erf(X / sqrt(2))) (the standard Gelu of opset 20)"),
    "GeluTanh": (("X",), {}, "0.5 * X * (1 + Tanh(sqrt(2 / pi) * (X + 0.044715 * X ^ 3))) (Gelu, "
                            "approximate=tanh, of opset 20)"),
    "RMSNorm": (("X", "scale"), {"epsilon": A.FLOAT},
                "X / Sqrt(ReduceMean(X * X, last axis) + epsilon) * scale (RMSNormalization of opset 23 over the "
                "last axis)"),
    "ScaledDotProductAttention": (("Q", "KT", "V", "mask"), {"scale": A.FLOAT},
                                  "MatMul(Softmax(MatMul(Q, KT) * scale + mask, last axis), V): attention with "
                                  "the keys given transposed and an additive mask (zero for none)"),
    "MultiHeadAttention": (("Q", "K", "V", "mask"), {"num_heads": A.INT, "scale": A.FLOAT},
                           "ScaledDotProductAttention over Q, K, V (batch, seq, num_heads * size) split into "
                           "heads, its output joined back into (batch, seq, num_heads * size): Attention of "
                           "opset 23 in its 3-D form, with an additive mask (zero for none)"),
}


def _transformer_body(name: str, body: BodyBuilder) -> None:
    body.require(13, name)  # Softmax over the last axis alone, ReduceMean axes as written
    if name in ("Gelu", "GeluTanh"):
        if name == "Gelu":
            inner = body.op("Erf", [body.op("Mul", ["X", body.float_constant(0.7071067811865476, "X")])])
        else:
            cube = body.op("Mul", ["X", body.op("Mul", ["X", "X"])])
            poly = body.op("Add", ["X", body.op("Mul", [cube, body.float_constant(0.044715, "X")])])
            inner = body.op("Tanh", [body.op("Mul", [poly, body.float_constant(0.7978845608028654, "X")])])
        one_plus = body.op("Add", [inner, body.float_constant(1.0, "X")])
        half = body.op("Mul", ["X", body.float_constant(0.5, "X")])
        body.op("Mul", [half, one_plus], out="Y")
    elif name == "RMSNorm":
        square = body.op("Mul", ["X", "X"])
        if body.opset >= 18:
            mean = body.op("ReduceMean", [square, body.constant(np.array([-1], dtype=np.int64))], keepdims=1)
        else:
            mean = body.op("ReduceMean", [square], axes=[-1], keepdims=1)
        root = body.op("Sqrt", [body.op("Add", [mean, body.float_attribute("epsilon", "X")])])
        body.op("Mul", [body.op("Div", ["X", root]), "scale"], out="Y")
    elif name == "ScaledDotProductAttention":
        _attention_body(body, "Q", "KT", "V", "Y")
    else:  # MultiHeadAttention: (batch, seq, heads * size) -> (batch, seq, heads, size), heads before seq
        heads = body.int_attribute("num_heads", above="Q")
        split = body.op("Concat", [body.constant(np.array([0, 0], dtype=np.int64)), heads,
                                   body.constant(np.array([-1], dtype=np.int64))], axis=0)
        q, k, v = (body.op("Transpose", [body.op("Reshape", [x, split])], perm=perm)
                   for x, perm in (("Q", [0, 2, 1, 3]), ("K", [0, 2, 3, 1]), ("V", [0, 2, 1, 3])))
        y = _attention_body(body, q, k, v)
        joined = body.op("Transpose", [y], perm=[0, 2, 1, 3])
        body.op("Reshape", [joined, body.constant(np.array([0, 0, -1], dtype=np.int64))], out="Y")


def _attention_body(body: BodyBuilder, q: str, kt: str, v: str, out: str | None = None) -> str:
    scores = body.op("MatMul", [q, kt])
    scaled = body.op("Mul", [scores, body.float_attribute("scale", q)])
    weights = body.op("Softmax", [body.op("Add", [scaled, "mask"])], axis=-1)
    return body.op("MatMul", [weights, v], out=out)


#: LayerNormalization of a residual sum, one kernel for the two ops (onnxruntime's contrib op for it is
#: SkipLayerNormalization, with optional gamma / beta / bias and the sum as its fourth output; these are not
#: that signature, so they do not take its name). Two ops, not one with an optional output: onnx's shape
#: inference rejects a call that leaves out a trailing output of a function. name -> outputs.
ADD_NORM_OPS = {"AddLayerNormalization": ("Y",), "AddLayerNormalizationWithSum": ("Y", "S")}
ADD_NORM_ATTRIBUTES = {"axis": A.INT, "epsilon": A.FLOAT, "stash_type": A.INT}


def _add_norm_body(body: BodyBuilder) -> None:
    body.require(17, "LayerNormalization")
    refs = tuple(ref(name, name, kind) for name, kind in ADD_NORM_ATTRIBUTES.items())
    body.op("Add", ["A", "B"], out="S")
    body.op("LayerNormalization", ["S", "scale", "bias"], out="Y", refs=refs)


@dataclass(frozen=True)
class OpSpec:
    """What the passes need to know about one fused op besides its ONNX function."""

    name: str
    build: Callable[[BodyBuilder], None]

    def body(self, opset: int) -> BodyBuilder:
        builder = BodyBuilder(opset)
        self.build(builder)
        return builder


SPECS: dict[str, OpSpec] = {}


def _define(name: str, inputs, outputs, attributes: dict[str, None], build, description: str) -> None:
    spec = OpSpec(name, build)
    SPECS[name] = spec
    if get_op(name) is None:
        register_op(DomainOp(name=name, inputs=tuple(inputs), outputs=tuple(outputs), attributes=attributes,
                             body=lambda opset, spec=spec: spec.body(opset).nodes, description=description))


def _define_all() -> None:
    for base in BASES.values():
        for activation in ACTIVATIONS.values():
            attributes = {name: None for name in base.attributes}
            attributes.update({name: None for name, _ in activation.params})
            _define(fused_name(base.name, activation.name), base.inputs, (base.output,), attributes,
                    lambda body, b=base, a=activation: _fused_body(b, a, body),
                    f"{base.name} followed by {activation.name}, run as one kernel")
    _define("ChannelShuffle", ("X",), ("Y",), {"group": None}, _shuffle_body,
            "channel shuffle: Reshape to [N, group, C/group, ...], swap the group axes, Reshape back")
    for name, (inputs, attributes, description) in TRANSFORMER_OPS.items():
        _define(name, inputs, ("Y",), {attr: None for attr in attributes},
                lambda body, n=name: _transformer_body(n, body), description)
    for name, outputs in ADD_NORM_OPS.items():
        _define(name, ("A", "B", "scale", "bias"), outputs, dict.fromkeys(ADD_NORM_ATTRIBUTES), _add_norm_body,
                "LayerNormalization of A + B" + (", and the sum A + B" if "S" in outputs else ""))
    for form in QLINEAR_FORMS.values():
        _define(form.name, form.inputs, (form.output,), {name: None for name in QLINEAR_ATTRIBUTES.get(form.op, {})},
                lambda body, f=form: _qlinear_body(f, body),
                f"{form.op} between DequantizeLinear and QuantizeLinear, run as one int8 kernel")


@dataclass(frozen=True)
class BodyInfo:
    #: Why the op has no body at this opset (a sentence), or None.
    unavailable: str | None
    #: The body holds float32 constants it cannot cast (opset below 15): valid for float32 data only.
    float32_only: bool


@lru_cache(maxsize=None)
def body_info(name: str, opset: int) -> BodyInfo:
    try:
        return BodyInfo(None, SPECS[name].body(opset).float32_only)
    except UnsupportedOpset as exc:
        return BodyInfo(str(exc), False)


_define_all()
