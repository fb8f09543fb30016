"""Multiply-accumulate counts per node, as ncnnoptimize prints them for conv and fully connected layers.

Counts come from shapes alone: a convolution does one MAC per output element per weight element of its
filter slice, a transposed convolution one per input element per weight element of its slice, Gemm and
MatMul one per output element per element of the reduced dimension. Bias adds and activations are not MACs.
The fused ops of the ``mirserve`` domain (``FusedConvRelu`` and friends) count as the op they wrap, and its
quantized forms ``QLinearConv`` / ``QLinearMatMul`` as the standard ops of those names.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

Shape = Sequence[int | str | None]


def _known(shape: Shape | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _conv(inputs: Sequence[Shape | None], outputs: Sequence[Shape | None], attributes: Mapping,
          weight_slot: int = 1) -> int | None:
    """Output elements x (input channels per group x kernel elements) = prod(out) x prod(W[1:])."""
    weight, out = _at(inputs, weight_slot), _at(outputs, 0)
    if not (_known(weight) and _known(out)) or len(weight) < 2:
        return None
    return math.prod(out) * math.prod(weight[1:])


def _conv_transpose(inputs, outputs, attributes) -> int | None:
    """Each input element is scattered through its (output channels per group x kernel) weights."""
    data, weight = _at(inputs, 0), _at(inputs, 1)
    if not (_known(data) and _known(weight)) or len(weight) < 2:
        return None
    return math.prod(data) * math.prod(weight[1:])


def _gemm(inputs, outputs, attributes) -> int | None:
    a, out = _at(inputs, 0), _at(outputs, 0)
    if not (_known(a) and _known(out)) or len(a) != 2:
        return None
    reduced = a[0] if attributes.get("transA", 0) else a[1]
    return math.prod(out) * reduced


def _matmul(inputs, outputs, attributes, a_slot: int = 0) -> int | None:
    a, out = _at(inputs, a_slot), _at(outputs, 0)
    if not (_known(a) and _known(out)) or not a:
        return None
    return math.prod(out) * a[-1]


def _at(shapes: Sequence[Shape | None], slot: int) -> Shape | None:
    return shapes[slot] if slot < len(shapes) else None


Counter = Callable[[Sequence, Sequence, Mapping], "int | None"]

#: Standard ops; QLinear* forms keep the weight (or B) after the scale and zero point of the first input.
STANDARD_COUNTERS: dict[str, Counter] = {
    "Conv": _conv,
    "ConvInteger": _conv,
    "QLinearConv": lambda i, o, a: _conv(i, o, a, weight_slot=3),
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "MatMulInteger": _matmul,
    "QLinearMatMul": _matmul,
}

#: Prefixes of the fused ops of the mirserve domain, longest first so FusedConvTranspose is not taken as Conv.
FUSED_PREFIXES = (("FusedConvTranspose", "ConvTranspose"), ("FusedConv", "Conv"), ("FusedGemm", "Gemm"),
                  ("FusedMatMul", "MatMul"))


def base_op(op_type: str, domain: str) -> str | None:
    """The op whose MACs ``op_type`` performs, or None when it performs none that are counted."""
    if domain in ("", "ai.onnx"):
        return op_type if op_type in STANDARD_COUNTERS else None
    if domain == "mirserve":
        if op_type in ("QLinearConv", "QLinearMatMul"):  # the standard QLinear inputs, the bias after them
            return op_type
        for prefix, base in FUSED_PREFIXES:
            if op_type.startswith(prefix):
                return base
    return None


def node_macs(op_type: str, domain: str, input_shapes: Sequence[Shape | None],
              output_shapes: Sequence[Shape | None], attributes: Mapping | None = None) -> int | None:
    """MACs of one node; 0 for ops that do none, None when a shape it needs is not known."""
    base = base_op(op_type, domain)
    if base is None:
        return 0
    return STANDARD_COUNTERS[base](input_shapes, output_shapes, attributes or {})
