"""The activations exporters write, as one op or decomposed, recognised as pattern fragments with one tolerance.

    Relu, Sigmoid, Tanh, HardSwish, LeakyRelu, HardSigmoid, Gelu (exact)   the op itself (mirserve.Gelu too)
    Clip(y, 0, 6) -> Relu6; Clip(y, 0, +inf) -> Relu                        other bounds are refused
    y * Sigmoid(y) -> Silu
    y * Sigmoid(alpha * y) -> Swish(alpha)                                  CLIP's quick_gelu: alpha 1.702
    y * HardSigmoid(y, 1/6, 1/2) -> HardSwish                               other alpha/beta are refused
    y * Clip(y + 3, 0, 6) / 6 -> HardSwish      (the division also as * 1/6, before or after the product)
    y * 0.5 * (1 + Erf(y / sqrt(2))) -> Gelu    (the product in any order, / sqrt(2) also as * 1/sqrt(2),
                                                 (y * u) * 0.5 also as (y * u) / 2)
    y * 0.5 * (1 + Tanh(sqrt(2 / pi) * (y + 0.044715 * y ^ 3))) -> GeluTanh   (Gelu, approximate="tanh";
                                                 y ^ 3 as Pow(y, 3) or y * (y * y); or BLOOM's
                                                 (sqrt(2 / pi) * y) * (1 + 0.044715 * y * y))

gelu_fuse and hard_swish_fuse turn the decomposed forms into the standard op; the mirserve activation
fusions fold any form into the op before it. A form is a fragment appended to a rule's pattern at the value
``y`` it reads; its output is the var ``out``. The structure is matched by the pattern; ``read`` then checks
the constants, all to the same relative tolerance ``RTOL``: below the verification tolerance, so taking a
form for its activation never changes a result beyond it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.mirserve_domain.activations import ALPHA, BETA
from worker.engine.mirserve_domain.ops import DOMAIN
from worker.engine.pattern import Match, Pattern, Rule, VarPattern, describe

#: The relative tolerance of every constant of a form (an absolute one for constants near zero).
RTOL, ATOL = 1e-5, 1e-7


#: The attribute values an activation carries (the mirserve function attributes ``activation_alpha`` ...).
Params = dict[str, float]


@dataclass(frozen=True)
class Form:
    name: str
    #: The activation the form computes (the suffix of the mirserve fused op's name).
    kind: str
    #: Appends the form to a pattern, reading ``y``; returns the output var (key "out").
    append: Callable[[Pattern, VarPattern], VarPattern]
    #: The activation's parameters, a sentence saying why the match is not this activation, or None when it
    #: is plainly another form (Clip(0, inf) is no Relu6 but Relu).
    read: Callable[[Match, int], Params | str | None]


class FormRule(Rule):
    """A rule matching one written-out form of an activation, its pattern reading ``x``; subclasses check and
    rewrite."""

    pattern_args = ("form",)

    def __init__(self, form: Form):
        super().__init__()
        self.form, self.name = form, form.name

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        self.form.append(p, p.var("x"))
        return p


# --- constants ------------------------------------------------------------------------------------------
def close(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=RTOL, abs_tol=ATOL)


def scalar(value: Value | None) -> float | None:
    """The one number a constant holds (every element equal), or None."""
    data = None if value is None else value.constant_value()
    if data is None or data.size == 0 or data.dtype.kind not in "fiu":
        return None
    flat = np.asarray(data).reshape(-1)
    return float(flat[0]) if np.all(flat == flat[0]) else None


def clip_bounds(node: Node, opset: int) -> tuple[float | None, float | None] | None:
    """(min, max) of a Clip, None for an absent bound; None when a bound is not a constant."""
    if opset < 11:
        low, high = node.attr("min"), node.attr("max")
        low = None if low is None or low <= -3.4e38 else float(low)
        high = None if high is None or high >= 3.4e38 else float(high)
        return low, high
    bounds = []
    for slot in (1, 2):
        if node.input(slot) is None:
            bounds.append(None)
            continue
        number = scalar(node.input(slot))
        if number is None:
            return None
        bounds.append(number)
    return bounds[0], bounds[1]


def _show(number: float | None) -> str:
    return "none" if number is None else f"{number:g}"


def _unexpected(match: Match, expected: dict[str, float], where: str, what: str) -> str | None:
    """A sentence naming the first constant of ``expected`` (key -> value) the match holds otherwise."""
    for key, value in expected.items():
        if key in match and not close(scalar(match.value(key)), value):
            return (f"the constant {match.value(key).name!r} of the chain at {describe(match.node(where))} is not "
                    f"{value:.6g}, so the chain is not {what}")
    return None


# --- single ops -----------------------------------------------------------------------------------------
def _single(op_type: str) -> Callable[[Pattern, VarPattern], VarPattern]:
    return lambda p, y: p.op(op_type, y, key="act", out="out")


def _no_params(match: Match, opset: int) -> Params:
    return {}


def _read_leaky_relu(match: Match, opset: int) -> Params:
    return {ALPHA: float(match.node("act").attr("alpha", 0.01))}


def _read_hard_sigmoid(match: Match, opset: int) -> Params:
    node = match.node("act")
    return {ALPHA: float(node.attr("alpha", 0.2)), BETA: float(node.attr("beta", 0.5))}


def _read_gelu(match: Match, opset: int) -> Params | str:
    approximate = match.node("act").attr("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate != "none":
        return f"Gelu with approximate={approximate!r} is not the exact Gelu"
    return {}


def _read_relu6(match: Match, opset: int) -> Params | str | None:
    bounds = clip_bounds(match.node("act"), opset)
    if bounds is None:
        return "the Clip bounds are not constant scalars"
    low, high = bounds
    if low == 0.0 and high == 6.0:
        return {}
    if low == 0.0 and high is None:
        return None  # Relu
    return f"Clip({_show(low)}, {_show(high)}) is not Relu6, which is Clip(0, 6)"


def _read_relu_clip(match: Match, opset: int) -> Params | None:
    return {} if clip_bounds(match.node("act"), opset) == (0.0, None) else None


# --- y * gate(y) ----------------------------------------------------------------------------------------
def _silu(p: Pattern, y: VarPattern) -> VarPattern:
    return p.Mul(y, p.Sigmoid(y, key="gate"), key="product", out="out", commutative=True)


def _swish(p: Pattern, y: VarPattern) -> VarPattern:
    scaled = p.Mul(y, p.var("alpha").const(), key="scale", commutative=True)
    return p.Mul(y, p.Sigmoid(scaled, key="gate"), key="product", out="out", commutative=True)


def _read_swish(match: Match, opset: int) -> Params | str:
    factor = match.value("alpha")
    alpha, data = scalar(factor), factor.constant_value()
    y = next(v for v in match.node("scale").inputs if v is not factor)
    if alpha is None or data.size != 1 or y.rank is None or data.ndim > y.rank:
        # a factor of higher rank than y would broadcast y to a larger shape than the activation keeps
        return "the factor inside the Sigmoid is not one constant number of at most y's rank"
    return {ALPHA: alpha}


def _hard_swish_by_hard_sigmoid(p: Pattern, y: VarPattern) -> VarPattern:
    return p.Mul(y, p.HardSigmoid(y, key="gate"), key="product", out="out", commutative=True)


def _read_hard_swish_by_hard_sigmoid(match: Match, opset: int) -> Params | str:
    gate = match.node("gate")
    alpha, beta = float(gate.attr("alpha", 0.2)), float(gate.attr("beta", 0.5))
    if not (close(alpha, 1.0 / 6.0) and close(beta, 0.5)):
        return (f"HardSigmoid(alpha={alpha:g}, beta={beta:g}) times its input is not HardSwish, which needs "
                f"alpha=1/6 and beta=0.5")
    return {}


def _hard_swish_by_clip(order: str) -> Callable[[Pattern, VarPattern], VarPattern]:
    """y * Clip(y + 3, 0, 6) / 6: the scale (Div by 6 or Mul by 1/6) after the product or on the Clip."""
    scale = "Div" if order.endswith("div") else "Mul"

    def append(p: Pattern, y: VarPattern) -> VarPattern:
        clipped = p.Clip(p.Add(y, p.var("three").const(), key="shift", commutative=True), key="clip")
        six = p.var("six").const()
        if order.startswith("product"):
            product = p.Mul(y, clipped, key="product", commutative=True)
            return p.op(scale, product, six, key="scale", out="out", commutative=scale == "Mul")
        gate = p.op(scale, clipped, six, key="scale", commutative=scale == "Mul")
        return p.Mul(y, gate, key="product", out="out", commutative=True)
    return append


def _read_hard_swish_by_clip(match: Match, opset: int) -> Params | str:
    offset, bounds = scalar(match.value("three")), clip_bounds(match.node("clip"), opset)
    scale = match.node("scale")
    divisor = 6.0 if scale.op_type == "Div" else 1.0 / 6.0
    if not close(offset, 3.0) or bounds != (0.0, 6.0) or not close(scalar(match.value("six")), divisor):
        low, high = bounds or (None, None)
        factor = scalar(match.value("six"))
        written = f"/ {_show(factor)}" if scale.op_type == "Div" else f"* {_show(factor)}"
        return (f"y * Clip(y + {_show(offset)}, {_show(low)}, {_show(high)}) {written} is not HardSwish, which is "
                f"y * Clip(y + 3, 0, 6) / 6")
    return {}


# --- Gelu -----------------------------------------------------------------------------------------------
GELU_TAILS = ("x_a_half", "x_a_div2", "a_half_x", "x_half_a")


def _gelu_tail(p: Pattern, y: VarPattern, a: VarPattern, tail: str) -> VarPattern:
    """y * a * 0.5 in one of the orders exporters write it."""
    half = p.var("half").const()
    if tail in ("x_a_half", "x_a_div2"):
        product = p.Mul(y, a, key="first", commutative=True)
        if tail == "x_a_half":
            return p.Mul(product, half, key="last", out="out", commutative=True)
        return p.Div(product, half, key="last", out="out")
    if tail == "a_half_x":
        return p.Mul(y, p.Mul(a, half, key="first", commutative=True), key="last", out="out", commutative=True)
    return p.Mul(p.Mul(y, half, key="first", commutative=True), a, key="last", out="out", commutative=True)


def _gelu_erf(shrink: str, tail: str) -> Callable[[Pattern, VarPattern], VarPattern]:
    def append(p: Pattern, y: VarPattern) -> VarPattern:
        inner = p.op(shrink, y, p.var("root").const(), key="shrink", commutative=shrink == "Mul")
        a = p.Add(p.Erf(inner, key="nonlinear"), p.var("one").const(), key="one_plus", commutative=True)
        return _gelu_tail(p, y, a, tail)
    return append


#: How exporters write sqrt(2 / pi) * (y + 0.044715 * y ^ 3): with Pow(y, 3) (torch's tanh-approximate gelu),
#: with y * (y * y) (Gemma's and GPT-J's written-out gelu_new, in either order), or factored as BLOOM's
#: (sqrt(2 / pi) * y) * (1 + 0.044715 * y * y).
GELU_CUBES = ("pow", "mul", "factored")


def _gelu_tanh(cube: str, tail: str) -> Callable[[Pattern, VarPattern], VarPattern]:
    def append(p: Pattern, y: VarPattern) -> VarPattern:
        if cube == "factored":
            square = p.Mul(p.Mul(y, p.var("cubic").const(), key="mul_cubic", commutative=True), y, key="pow",
                           commutative=True)
            inner = p.Mul(p.Mul(y, p.var("sqrt_2_pi").const(), key="scale_in", commutative=True),
                          p.Add(square, p.var("one_inner").const(), key="add_x", commutative=True),
                          key="product_in", commutative=True)
            a = p.Add(p.Tanh(inner, key="nonlinear"), p.var("one").const(), key="one_plus", commutative=True)
            return _gelu_tail(p, y, a, tail)
        power = p.Pow(y, p.var("cube").const(), key="pow") if cube == "pow" else \
            p.Mul(y, p.Mul(y, y, key="square"), key="pow", commutative=True)
        cubed = p.Mul(power, p.var("cubic").const(), key="mul_cubic", commutative=True)
        inner = p.Mul(p.Add(y, cubed, key="add_x", commutative=True), p.var("sqrt_2_pi").const(),
                      key="scale_in", commutative=True)
        a = p.Add(p.Tanh(inner, key="nonlinear"), p.var("one").const(), key="one_plus", commutative=True)
        return _gelu_tail(p, y, a, tail)
    return append


def _read_gelu_chain(kind: str) -> Callable[[Match, int], Params | str]:
    def read(match: Match, opset: int) -> Params | str:
        expected = {"one": 1.0, "half": 2.0 if match.node("last").op_type == "Div" else 0.5}
        if kind == "Gelu":
            expected["root"] = math.sqrt(2) if match.node("shrink").op_type == "Div" else 1 / math.sqrt(2)
        else:
            expected.update(cubic=0.044715, sqrt_2_pi=math.sqrt(2 / math.pi))
            expected["one_inner"] = 1.0  # the factored form's (a key the match lacks is not checked)
            if match.node("pow").op_type == "Pow":
                expected["cube"] = 3.0
        return _unexpected(match, expected, "nonlinear", "Gelu") or {}
    return read


def _snake(op_type: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in op_type).lstrip("_")


#: Compound forms first: their first node (Sigmoid, HardSigmoid) would otherwise be taken alone.
FORMS: tuple[Form, ...] = (
    *(Form(f"gelu_erf_{shrink.lower()}_{tail}", "Gelu", _gelu_erf(shrink, tail), _read_gelu_chain("Gelu"))
      for shrink in ("Div", "Mul") for tail in GELU_TAILS),
    *(Form(f"gelu_tanh_{cube}_{tail}", "GeluTanh", _gelu_tanh(cube, tail), _read_gelu_chain("GeluTanh"))
      for cube in GELU_CUBES for tail in GELU_TAILS),
    *(Form(f"hard_swish_clip_{order}", "HardSwish", _hard_swish_by_clip(order), _read_hard_swish_by_clip)
      for order in ("product_div", "product_mul", "clip_div", "clip_mul")),
    Form("hard_swish_hard_sigmoid", "HardSwish", _hard_swish_by_hard_sigmoid, _read_hard_swish_by_hard_sigmoid),
    Form("silu", "Silu", _silu, _no_params),
    Form("swish", "Swish", _swish, _read_swish),
    *(Form(f"op_{_snake(op)}", op, _single(op), _no_params) for op in ("Relu", "Sigmoid", "Tanh", "HardSwish")),
    Form("op_leaky_relu", "LeakyRelu", _single("LeakyRelu"), _read_leaky_relu),
    Form("op_hard_sigmoid", "HardSigmoid", _single("HardSigmoid"), _read_hard_sigmoid),
    Form("op_gelu", "Gelu", _single("Gelu"), _read_gelu),
    # transformer_domain_fuse's exact Gelu below opset 20 (an exported chain it fused before the fusions here)
    Form("op_mirserve_gelu", "Gelu", lambda p, y: p.op("Gelu", y, key="act", out="out", domain=DOMAIN), _no_params),
    Form("op_clip_relu6", "Relu6", _single("Clip"), _read_relu6),
    Form("op_clip_relu", "Relu", _single("Clip"), _read_relu_clip),
)


def forms(*prefixes: str) -> list[Form]:
    """The forms whose names start with one of ``prefixes``, in precedence order."""
    return [form for form in FORMS if form.name.startswith(prefixes)]
