"""The activations a fused op may end with, and how each is written in a function body per opset.

Names are the suffixes of the fused op names (``FusedConvRelu6``). Parameters are function attributes named
``activation_alpha`` / ``activation_beta``, so they never clash with the base op's own ``alpha``/``beta``
(Gemm). Bodies use the activation's own op where the opset has it and a decomposition otherwise:

    Relu6      Clip(x, 0, 6)                    (bounds as attributes before opset 11, inputs from 11)
    LeakyRelu  PRelu(x, alpha)                  (see body.py: why not LeakyRelu with a referenced alpha)
    HardSigmoid Clip(alpha * x + beta, 0, 1)
    HardSwish  HardSwish(x) from opset 14, x * HardSigmoid(x, 1/6, 1/2) before
    Silu       x * Sigmoid(x)
    Swish      x * Sigmoid(alpha * x)           (opset 24's Swish; CLIP's quick_gelu is alpha 1.702)
    Gelu       x * 0.5 * (1 + Erf(x / sqrt(2))) (from opset 9; also from 20, see _gelu)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from worker.engine.mirserve_domain.body import BodyBuilder

ALPHA, BETA = "activation_alpha", "activation_beta"


@dataclass(frozen=True)
class Activation:
    name: str
    #: Function attributes (all float) and the values the standard op uses when the attribute is absent.
    params: tuple[tuple[str, float], ...]
    #: Adds nodes computing the activation of ``x`` into the body, the last one producing ``out``.
    emit: Callable[[BodyBuilder, str, str], None]


def _unary(op_type: str) -> Callable[[BodyBuilder, str, str], None]:
    def emit(body: BodyBuilder, x: str, out: str) -> None:
        body.op(op_type, [x], out=out)
    return emit


def _clip(body: BodyBuilder, x: str, low: float, high: float, out: str | None = None) -> str:
    if body.opset < 11:
        return body.op("Clip", [x], out=out, min=low, max=high)
    return body.op("Clip", [x, body.float_constant(low, x), body.float_constant(high, x)], out=out)


def _relu6(body: BodyBuilder, x: str, out: str) -> None:
    _clip(body, x, 0.0, 6.0, out)


def _leaky_relu(body: BodyBuilder, x: str, out: str) -> None:
    body.op("PRelu", [x, body.float_attribute(ALPHA, x)], out=out)


def _hard_sigmoid(body: BodyBuilder, x: str, out: str) -> None:
    scaled = body.op("Mul", [x, body.float_attribute(ALPHA, x)])
    shifted = body.op("Add", [scaled, body.float_attribute(BETA, x)])
    _clip(body, shifted, 0.0, 1.0, out)


def _hard_swish(body: BodyBuilder, x: str, out: str) -> None:
    if body.opset >= 14:
        body.op("HardSwish", [x], out=out)
        return
    gate = body.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
    body.op("Mul", [x, gate], out=out)


def _silu(body: BodyBuilder, x: str, out: str) -> None:
    body.op("Mul", [x, body.op("Sigmoid", [x])], out=out)


def _swish(body: BodyBuilder, x: str, out: str) -> None:
    # Written out even from opset 24, where Swish is an op, as Gelu is (onnxruntime and onnx.reference run
    # the decomposition everywhere).
    scaled = body.op("Mul", [x, body.float_attribute(ALPHA, x)])
    body.op("Mul", [x, body.op("Sigmoid", [scaled])], out=out)


def _gelu(body: BodyBuilder, x: str, out: str) -> None:
    # Even from opset 20, where Gelu is an op: onnx.reference implements it only as a context-dependent
    # function, which it cannot expand inside another function's body.
    body.require(9, "Gelu written with Erf")
    erf = body.op("Erf", [body.op("Div", [x, body.float_constant(math.sqrt(2.0), x)])])
    one_plus = body.op("Add", [erf, body.float_constant(1.0, x)])
    half_x = body.op("Mul", [x, body.float_constant(0.5, x)])
    body.op("Mul", [half_x, one_plus], out=out)


ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("Relu", (), _unary("Relu")),
    Activation("Relu6", (), _relu6),
    Activation("LeakyRelu", ((ALPHA, 0.01),), _leaky_relu),
    Activation("Sigmoid", (), _unary("Sigmoid")),
    Activation("HardSigmoid", ((ALPHA, 0.2), (BETA, 0.5)), _hard_sigmoid),
    Activation("HardSwish", (), _hard_swish),
    Activation("Silu", (), _silu),
    Activation("Swish", ((ALPHA, 1.0),), _swish),
    Activation("Gelu", (), _gelu),
    Activation("Tanh", (), _unary("Tanh")),
)}
