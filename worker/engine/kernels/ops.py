"""Facts about ops that decide how their kernels declare layouts and which inputs live on the host.

These are properties of the ONNX ops themselves, not of any target: an elementwise op computes the same
thing whatever the layout of its (equally laid out) operands, so its kernels declare layout ``any``; a
convolution reads its channel axis from a fixed position, so it has one kernel per layout and, in a file,
an NHWC kernel needs its data and weights transposed.
"""
from __future__ import annotations

from dataclasses import dataclass

from worker.engine.kernels.schema import SAME

ACTIVATIONS = ("Relu", "Relu6", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Silu", "Swish", "Gelu", "Tanh")

#: The fused ops issue 3 emits in the project's domain, by base op.
FUSED_BASES = ("FusedConv", "FusedConvTranspose", "FusedGemm", "FusedMatMul", "FusedAdd")



@dataclass(frozen=True)
class QLinearForm:
    """The own-domain op that DequantizeLinear -> ``op`` -> QuantizeLinear becomes (qlinear_fuse).

    Its inputs follow onnxruntime's QLinear kernels: each 8-bit operand with its scale and zero point, then
    the output's scale and zero point, then (Conv) an optional float bias. Scales and the bias are float32;
    operands and zero points are 8-bit, so the kernel computes in int8.
    """

    op: str
    operands: tuple[str, ...]
    output: str
    bias: bool = False

    @property
    def name(self) -> str:
        return f"QLinear{self.op}"

    @property
    def inputs(self) -> tuple[str, ...]:
        names = [f"{n}{suffix}" for n in self.operands for suffix in ("", "_scale", "_zero_point")]
        return (*names, f"{self.output}_scale", f"{self.output}_zero_point", *(("B",) if self.bias else ()))

    def input_precision(self, slot: int) -> str:
        """``same`` (the kernel's int8) for operands and zero points, ``fp32`` for scales and the bias."""
        is_bias = self.bias and slot == len(self.inputs) - 1
        return "fp32" if is_bias or self.inputs[slot].endswith("_scale") else SAME


QLINEAR_FORMS: dict[str, QLinearForm] = {f.op: f for f in (
    QLinearForm("Conv", ("x", "w"), "y", bias=True),
    QLinearForm("MatMul", ("a", "b"), "y"),
    QLinearForm("Add", ("A", "B"), "C"),
    QLinearForm("Mul", ("A", "B"), "C"),
    QLinearForm("GlobalAveragePool", ("X",), "Y"),
    QLinearForm("Sigmoid", ("X",), "Y"),
    QLinearForm("Softmax", ("X",), "Y"),  # over the last axis
)}

#: Ops whose result element i depends only on element i of each (broadcast) operand: layout-agnostic as
#: long as every operand of rank 4 shares the layout (QuantizeLinear / DequantizeLinear with per-tensor
#: parameters; a per-axis one reads a rank-1 scale along an axis, which kernel pick keeps nchw).
LAYOUT_AGNOSTIC = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitShift", "BitwiseAnd",
    "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div",
    "Dropout", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu", "Greater", "GreaterOrEqual", "HardSigmoid",
    "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual", "Log", "Max", "Mean", "Min",
    "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu", "Round", "Selu", "Shrink",
    "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh",
    "ThresholdedRelu", "Where", "Xor", "QuantizeLinear", "DequantizeLinear",
})

#: Own-domain ops that are layout-agnostic (casts move or convert data element by element).
LAYOUT_AGNOSTIC_OWN = frozenset({"io_copy", "calib", *(f"FusedAdd{act}" for act in ACTIVATIONS)})

#: Ops an NHWC kernel may run, with the input and output slots that carry NHWC data (rank-4 tensors whose
#: channel axis moves): the data input, and the weights of convolutions (stored transposed in the file).
NHWC_SLOTS: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...]]] = {
    ("Conv", ""): ((0, 1), (0,)),
    ("ConvTranspose", ""): ((0, 1), (0,)),
    ("MaxPool", ""): ((0,), (0,)),
    ("AveragePool", ""): ((0,), (0,)),
    ("GlobalAveragePool", ""): ((0,), (0,)),
    ("GlobalMaxPool", ""): ((0,), (0,)),
    ("Resize", ""): ((0,), (0,)),
    ("BatchNormalization", ""): ((0,), (0,)),
    ("InstanceNormalization", ""): ((0,), (0,)),
    ("DepthToSpace", ""): ((0,), (0,)),
    ("SpaceToDepth", ""): ((0,), (0,)),
    ("LRN", ""): ((0,), (0,)),
    ("ChannelShuffle", "mirserve"): ((0,), (0,)),
    **{(f"FusedConv{act}", "mirserve"): ((0, 1), (0,)) for act in ACTIVATIONS},
    **{(f"FusedConvTranspose{act}", "mirserve"): ((0, 1), (0,)) for act in ACTIVATIONS},
}

#: How many inputs an op's NHWC form takes (every call passes all of them: onnx.reference wants a
#: function's inputs complete); a convolution without bias gets a zero bias. Default: the required inputs.
NHWC_ARITY = {"Conv": 3, "ConvTranspose": 3, "Resize": 3, "InstanceNormalization": 3, "BatchNormalization": 5,
              **{f"{base}{act}": 3 for base in ("FusedConv", "FusedConvTranspose") for act in ACTIVATIONS}}
#: Prefix of the own-domain op a layout-sensitive node on an NHWC kernel becomes (NhwcConv, NhwcMaxPool).
NHWC_PREFIX = "Nhwc"

#: Standard elementwise ops whose output shape is their inputs' broadcast (numpy's rules; PRelu's slope to X).
BROADCASTING_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater",
                              "Less", "GreaterOrEqual", "LessOrEqual", "Where", "Max", "Min", "Sum", "Mean",
                              "PRelu", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})

#: Inputs that hold shapes, axes, sizes or counts: a device kernel reads them from host memory (as
#: onnxruntime's CUDA kernels declare with OrtMemTypeCPUInput), so they never need an io_copy.
SHAPE_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Tile": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}), "Squeeze": frozenset({1}), "Unsqueeze": frozenset({1}),
    "Resize": frozenset({1, 2, 3}), "Upsample": frozenset({1}), "ConstantOfShape": frozenset({0}),
    "Range": frozenset({0, 1, 2}), "TopK": frozenset({1}), "Pad": frozenset({1, 2, 3}),
    "Split": frozenset({1}), "OneHot": frozenset({1}), "CumSum": frozenset({1}),
    "ReduceMean": frozenset({1}), "ReduceSum": frozenset({1}), "ReduceMax": frozenset({1}),
    "ReduceMin": frozenset({1}), "ReduceProd": frozenset({1}), "ReduceL1": frozenset({1}),
    "ReduceL2": frozenset({1}), "ReduceLogSum": frozenset({1}), "ReduceLogSumExp": frozenset({1}),
    "ReduceSumSquare": frozenset({1}), "Clip": frozenset(), "NonMaxSuppression": frozenset({2, 3, 4}),
}


def is_layout_agnostic(op: str, domain: str) -> bool:
    if domain == "":
        return op in LAYOUT_AGNOSTIC
    return domain == "mirserve" and op in LAYOUT_AGNOSTIC_OWN


def nhwc_slots(op: str, domain: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    return NHWC_SLOTS.get((op, domain))


#: Own-domain transformer ops (mirserve_domain/fused.py TRANSFORMER_OPS and ADD_NORM_OPS): name -> (inputs,
#: outputs).
TRANSFORMER_OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Gelu": (("X",), ("Y",)), "GeluTanh": (("X",), ("Y",)), "RMSNorm": (("X", "scale"), ("Y",)),
    "ScaledDotProductAttention": (("Q", "KT", "V", "mask"), ("Y",)),
    "MultiHeadAttention": (("Q", "K", "V", "mask"), ("Y",)),
    "AddLayerNormalization": (("A", "B", "scale", "bias"), ("Y",)),
    "AddLayerNormalizationWithSum": (("A", "B", "scale", "bias"), ("Y", "S")),
}


def fused_op_names() -> list[str]:
    return [f"{base}{act}" for base in FUSED_BASES for act in ACTIVATIONS]


def qlinear_form(op: str) -> QLinearForm | None:
    """The quantized form named ``op`` (``QLinearAdd``), or None."""
    return QLINEAR_FORMS.get(op.removeprefix("QLinear")) if op.startswith("QLinear") else None
