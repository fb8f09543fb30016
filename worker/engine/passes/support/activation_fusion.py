"""Fusing an op with the activation applied to its output into one op of the ``mirserve`` domain: the plan
and the rewrite shared by conv_activation_fuse, gemm_activation_fuse and elementwise_activation_fuse. A
target runs the fused op as one kernel (Paddle-Lite's conv_activation and elementwise_activation fusions,
ncnnoptimize's fuse_*_activation).

    Conv(X, W[, B]) -> act              =>  mirserve.FusedConv<Act>(X, W, B or zeros)
    ConvTranspose(X, W[, B]) -> act     =>  mirserve.FusedConvTranspose<Act>(X, W, B or zeros)
    Gemm(A, B[, C]) -> act              =>  mirserve.FusedGemm<Act>(A, B, C or 0)
    MatMul(A, B) -> act                 =>  mirserve.FusedMatMul<Act>(A, B)
    Add(A, B) or Sum(A, B) -> act       =>  mirserve.FusedAdd<Act>(A, B)

``act`` is any form ``activations.py`` recognises (decomposed HardSwish, Silu and Gelu included). Preconditions: only
the activation reads the op's output and the activation's intermediates; the body exists at the model's opset
for the data's type; some valid place has a kernel for the fused op (when kernel tables are loaded). Every
attribute is written explicitly (the standard op's defaults filled in; auto_pad turned into pads), because
``onnx.reference`` rejects a function call that omits one. Numeric effect: none for single-op activations;
decomposed forms are recomputed in the body's order (last-bit rounding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import helper

from worker.engine.ir import Node, Value
from worker.engine.mirserve_domain.activations import ACTIVATIONS
from worker.engine.mirserve_domain.fused import BASES, Base, fused_name
from worker.engine.mirserve_domain.ops import DOMAIN, VERSION
from worker.engine.passes.base import PassContext
from worker.engine.passes.support.activations import FORMS, Form
from worker.engine.passes.support.mirserve_ops import emit_refusal
from worker.engine.passes.support.placement import constant_facts, placement_refusal, planned_facts
from worker.engine.pattern import Match, Pattern, Rule


@dataclass
class Plan:
    inputs: list[Value | None]
    attributes: dict
    #: (slot, shape) of an absent optional input to pass as zeros.
    zeros: tuple[int, tuple[int, ...]] | None = None


# --- attributes, explicit ------------------------------------------------------------------------------
def _unknown_attributes(node: Node, allowed: set[str]) -> str | None:
    unknown = sorted(set(node.attributes) - allowed)
    if unknown:
        return f"it has attribute(s) {', '.join(unknown)}, which the fused op does not carry"
    return None


def _same_pads(node: Node, attrs: dict, upper: bool) -> list[int] | str:
    """Explicit pads for auto_pad SAME_UPPER / SAME_LOWER, from static input and kernel sizes."""
    x, w = node.input(0), node.input(1)
    spatial = x.shape[2:] if x.shape is not None else None
    kernel = w.shape[2:] if w.shape is not None else node.attr("kernel_shape")
    if spatial is None or kernel is None or not all(isinstance(d, int) for d in (*spatial, *kernel)):
        return "auto_pad SAME needs static input and kernel sizes to become explicit pads"
    begins, ends = [], []
    for size, k, stride, dilation in zip(spatial, kernel, attrs["strides"], attrs["dilations"]):
        out = math.ceil(size / stride)
        total = max(0, (out - 1) * stride + (k - 1) * dilation + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


def conv_attributes(node: Node, transpose: bool) -> dict | str:
    base = BASES["ConvTranspose" if transpose else "Conv"]
    refusal = _unknown_attributes(node, set(base.attributes) | {"auto_pad", "kernel_shape", "output_shape"})
    if refusal:
        return refusal
    rank = node.input(1).rank or node.input(0).rank
    if rank is None or rank < 3:
        return "the rank of its weight is unknown"
    k = rank - 2
    attrs = {"dilations": [int(d) for d in node.attr("dilations", [1] * k)], "group": int(node.attr("group", 1)),
             "pads": [int(p) for p in node.attr("pads", [0] * 2 * k)],
             "strides": [int(s) for s in node.attr("strides", [1] * k)]}
    auto_pad = node.attr("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if transpose:
        attrs["output_padding"] = [int(p) for p in node.attr("output_padding", [0] * k)]
        if node.has_attr("output_shape") or auto_pad not in ("NOTSET", "VALID"):
            return "it sets output_shape or auto_pad SAME, and the fused op takes explicit pads only"
    if auto_pad == "VALID":
        attrs["pads"] = [0] * 2 * k
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(node, attrs, upper=auto_pad == "SAME_UPPER")
        if isinstance(pads, str):
            return pads
        attrs["pads"] = pads
    elif auto_pad != "NOTSET":
        return f"its auto_pad {auto_pad!r} is not one ONNX defines"
    return attrs


def _gemm_attributes(node: Node) -> dict | str:
    refusal = _unknown_attributes(node, set(BASES["Gemm"].attributes))
    if refusal:
        return refusal
    return {"alpha": float(node.attr("alpha", 1.0)), "beta": float(node.attr("beta", 1.0)),
            "transA": int(node.attr("transA", 0)), "transB": int(node.attr("transB", 0))}


# --- operands ------------------------------------------------------------------------------------------
def _output_channels(weight: Value, transpose: bool, group: int) -> int | None:
    """Conv weights are [M, C/group, k...], ConvTranspose weights [C, M/group, k...]."""
    shape = weight.shape
    dim = None if shape is None or len(shape) < 2 else shape[1] if transpose else shape[0]
    if not isinstance(dim, int):
        return None
    return dim * group if transpose else dim


def _plan(node: Node, base: Base) -> Plan | str:
    if base.name in ("Conv", "ConvTranspose"):
        attrs = conv_attributes(node, transpose=base.name == "ConvTranspose")
        if isinstance(attrs, str):
            return attrs
        plan = Plan([node.input(0), node.input(1), node.input(2)], attrs)
        if node.input(2) is None:
            channels = _output_channels(node.input(1), base.name == "ConvTranspose", attrs["group"])
            if channels is None:
                return "it has no bias and its weight's shape is unknown, so no zero bias can stand in for it"
            plan.zeros = (2, (channels,))
        return plan
    if base.name == "Gemm":
        attrs = _gemm_attributes(node)
        if isinstance(attrs, str):
            return attrs
        plan = Plan([node.input(0), node.input(1), node.input(2)], attrs)
        if node.input(2) is None:
            plan.zeros = (2, (1,))
        return plan
    refusal = _unknown_attributes(node, set())
    return refusal or Plan([node.input(0), node.input(1)], {})


# --- the fusion ----------------------------------------------------------------------------------------
def is_binary(node: Node) -> bool:
    """has two inputs (a Sum of more is no Add)"""
    return node.op_type != "Sum" or len(node.inputs) == 2


class ActivationFusion(Rule):
    """An op of ``base`` (one of ``op_types``) and the activation ``form`` applied to its output."""

    pattern_args = ("op_types", "form")

    def __init__(self, base: Base, op_types: tuple[str, ...], form: Form):
        super().__init__()
        self.base, self.op_types, self.form = base, op_types, form
        self.name = fused_name(base.name, form.kind)

    def build_pattern(self) -> Pattern:
        p = Pattern(f"{self.name}_{self.form.name}")
        self.form.append(p, p.op(self.op_types, key="op", out="y", when=is_binary))
        return p

    def check(self, ctx: PassContext, match: Match) -> Plan | str | None:
        params = self.form.read(match, ctx.opset(""))
        if params is None or isinstance(params, str):
            return params
        plan = emit_refusal(ctx, self.name, match.value("y").dtype) or _plan(match.node("op"), self.base)
        if isinstance(plan, Plan):
            plan.attributes.update(params)
            return self._placement_refusal(ctx, match, plan) or plan
        return plan

    def _placement_refusal(self, ctx: PassContext, match: Match, plan: Plan) -> str | None:
        """The fused op must run on a place at least as good as the op and the activation would get."""
        inputs: list = list(plan.inputs)
        if plan.zeros is not None:
            slot, shape = plan.zeros
            inputs[slot] = constant_facts(match.value("y").dtype, shape)
        facts = planned_facts(self.name, DOMAIN, VERSION, inputs, [match.value("out")], plan.attributes,
                              match.node("op").name)
        return placement_refusal(ctx, facts, match.nodes)

    def rewrite(self, ctx: PassContext, match: Match, plan: Plan) -> Node:
        node, graph = match.node("op"), match.graph
        inputs = list(plan.inputs)
        if plan.zeros is not None:
            slot, shape = plan.zeros
            dtype = helper.tensor_dtype_to_np_dtype(match.value("y").dtype)
            inputs[slot] = graph.add_initializer(f"{node.name}_zero_bias", np.zeros(shape, dtype=dtype))
        return graph.add_node(self.name, inputs, [match.value("out")], domain=DOMAIN, attributes=plan.attributes,
                              name=f"{node.name}_{self.form.kind.lower()}", before=node)


def activation_rules(bases: dict[str, tuple[str, ...]]) -> list[ActivationFusion]:
    """One rule per base (base name -> the op types it stands for) and activation form the domain has."""
    return [ActivationFusion(BASES[base], op_types, form) for form in FORMS if form.kind in ACTIVATIONS
            for base, op_types in bases.items()]
