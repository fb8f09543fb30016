"""Arithmetic for folding per-channel factors into conv and Gemm weights, in float64.

Every function takes and returns new arrays (loaded weights are read-only views of the file). Callers fold in
float64 and cast back with ``cast_like``, so a fused model stays within rtol 1e-4 / atol 1e-5 of the input.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

#: Element types a fold may compute on (numpy has no bfloat16).
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE})

CONV_OPS = ("Conv", "ConvTranspose")


def numpy_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX float element type (float32 when unknown)."""
    return np.dtype({TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}.get(elem_type, np.float32))


def f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def cast_like(array: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``array`` in the dtype of ``like``, always a fresh contiguous array."""
    return np.ascontiguousarray(array, dtype=np.asarray(like).dtype).copy()


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
