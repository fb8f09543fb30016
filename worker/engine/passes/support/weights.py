"""Folding per-channel factors into conv and Gemm weights: why a weight cannot take one, the arithmetic in
float64, and the conv rebuilt with the new weights.

Every function takes and returns new arrays (loaded weights are read-only views of the file). Callers fold in
float64 and cast back with ``cast_like``, so a fused model stays within rtol 1e-4 / atol 1e-5 of the input.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from onnx import TensorProto

from worker.engine.ir import Graph, Node, Value
from worker.engine.pattern import describe

#: Element types a fold may compute on (numpy has no bfloat16).
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE})

CONV_OPS = ("Conv", "ConvTranspose")


def numpy_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX float element type (float32 when unknown)."""
    return np.dtype({TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}.get(elem_type, np.float32))


def f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def cast_like(array: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``array`` in the dtype of ``like``, always a fresh contiguous array of the same shape (0-d stays 0-d)."""
    return np.array(array, dtype=np.asarray(like).dtype, order="C", copy=True)


def factor_refusal(factor: np.ndarray, name: str, scaled: Sequence[np.ndarray] = ()) -> str | None:
    """Why multiplying the constants ``scaled`` by ``factor`` would not compute what the Mul or Div of the
    constant ``name`` computed, as a sentence: a NaN or infinite factor (a Div by zero among them: the
    products reorder infinities into NaN), or products beyond the largest value of the constants' type."""
    with np.errstate(all="ignore"):
        factor = f64(factor)
        if not np.all(np.isfinite(factor)):
            return f"the constant {name!r} is NaN or infinite, or divides by zero"
        largest = float(np.max(np.abs(factor))) if factor.size else 0.0
        for array in scaled:
            array = np.asarray(array)
            if array.size and array.dtype.kind == "f" and \
                    float(np.max(np.abs(f64(array)))) * largest >= float(np.finfo(array.dtype).max):
                return f"scaling by the constant {name!r} would overflow {array.dtype} weights"
    return None


def channel_vector(array: np.ndarray, rank: int, channels: int, axis: int = 1) -> np.ndarray | None:
    """The per-channel vector (length ``channels``) of a constant broadcast against a rank-``rank`` tensor.

    None when the constant varies along another axis, or would enlarge the tensor by broadcasting.
    """
    array = np.asarray(array)
    if array.ndim > rank:
        return None
    shape = (1,) * (rank - array.ndim) + array.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(f64(array).reshape(-1), (channels,)).copy()


def conv_out_channels(op_type: str, weight: np.ndarray, group: int) -> int:
    """Output channels: W is [C_out, C_in/g, k...] for Conv and [C_in, C_out/g, k...] for ConvTranspose."""
    return weight.shape[0] if op_type == "Conv" else weight.shape[1] * group


def conv_in_channels(op_type: str, weight: np.ndarray, group: int) -> int:
    return weight.shape[1] * group if op_type == "Conv" else weight.shape[0]


def scale_conv_outputs(op_type: str, weight: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """W such that conv(x, W) == conv(x, weight) * scale[c] on every output channel c."""
    w, s = f64(weight), f64(scale)
    spatial = (1,) * (w.ndim - 2)
    if op_type == "Conv":
        return w * s.reshape((-1, 1) + spatial)
    per_group = w.reshape((group, w.shape[0] // group) + w.shape[1:])
    return (per_group * s.reshape((group, 1, -1) + spatial)).reshape(w.shape)


def scale_conv_inputs(op_type: str, weight: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """W such that conv(x, W) == conv(x * scale[c], weight), scale given per input channel c."""
    w, s = f64(weight), f64(scale)
    spatial = (1,) * (w.ndim - 2)
    if op_type == "ConvTranspose":
        return w * s.reshape((-1, 1) + spatial)
    per_group = w.reshape((group, w.shape[0] // group) + w.shape[1:])
    return (per_group * s.reshape((group, 1, -1) + spatial)).reshape(w.shape)


def conv_of_constant(weight: np.ndarray, shift: np.ndarray, group: int) -> np.ndarray:
    """Per output channel, what an unpadded Conv adds when every input channel c is shifted by shift[c]."""
    w, b = f64(weight), f64(shift)
    c_out, c_in_group = w.shape[0], w.shape[1]
    summed = w.reshape(group, c_out // group, c_in_group, -1).sum(axis=-1)
    return np.einsum("goi,gi->go", summed, b.reshape(group, c_in_group)).reshape(c_out)


def batchnorm_factors(scale, bias, mean, var, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """BatchNormalization as y = x * a + b per channel: a = scale / sqrt(var + epsilon), b = bias - mean * a."""
    a = f64(scale) / np.sqrt(f64(var) + float(epsilon))
    return a, f64(bias) - f64(mean) * a


# --- refusals and the rebuilt conv --------------------------------------------------------------------
def fused_name(base: str) -> str:
    """``base`` + "_fused", without piling suffixes up when a weight is fused again."""
    return re.sub(r"(_fused)?(__\d+)?$", "", base, count=1) + "_fused"


def constant_refusal(node: Node, slot: int, what: str) -> str | None:
    """Why input ``slot`` of ``node`` cannot be folded into: absent, quantized, not constant, not float."""
    value = node.input(slot)
    if value is None:
        return f"{describe(node)} has no {what}"
    producer = value.producer
    if producer is not None and producer.op_type == "DequantizeLinear":
        return (f"the {what} of {describe(node)} are quantized (they come from DequantizeLinear "
                f"{producer.name!r}), and folding into them would change the quantized values")
    data = value.constant_value()
    if data is None:
        return f"the {what} of {describe(node)} ({value.name!r}) are not constants"
    if data.dtype not in (np.float16, np.float32, np.float64):
        return f"the {what} of {describe(node)} are {data.dtype}, and only float weights are folded"
    return None


def conv_refusal(conv: Node) -> str | None:
    """Why a Conv/ConvTranspose's weights and bias cannot absorb a per-channel factor."""
    refusal = constant_refusal(conv, 1, "weights") or (
        constant_refusal(conv, 2, "bias") if conv.input(2) is not None else None)
    if refusal:
        return refusal
    weight, group = conv.input(1).constant_value(), conv.attr("group", 1)
    if weight.ndim < 3 or group < 1 or weight.shape[0] % group:
        return f"the weights of {describe(conv)} have shape {list(weight.shape)}, which does not fit group={group}"
    return None


def conv_bias(conv: Node, channels: int) -> np.ndarray:
    """The conv's bias as float64, zeros when it has none."""
    value = conv.input(2)
    if value is None:
        return np.zeros(channels)
    return np.asarray(value.constant_value(), dtype=np.float64)


def fused_conv(graph: Graph, conv: Node, weight: np.ndarray | None, bias: np.ndarray, output: Value, *,
               before: Node) -> Node:
    """A copy of ``conv`` producing ``output`` with a new bias and new weights (None: its own weights), cast
    to the old weights' type, placed before ``before``."""
    old_weight = conv.input(1)
    like = old_weight.constant_value()
    new_weight = old_weight if weight is None else \
        graph.add_initializer(fused_name(old_weight.name), cast_like(weight, like))
    bias_name = conv.input(2).name if conv.input(2) is not None else f"{conv.name}_bias"
    new_bias = graph.add_initializer(fused_name(bias_name), cast_like(bias, like))
    return graph.add_node(conv.op_type, [conv.input(0), new_weight, new_bias], outputs=[output],
                          name=conv.name, attributes=dict(conv.attributes), before=before)
