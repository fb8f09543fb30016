"""add_layer_norm_fuse: a transformer block's residual Add and the LayerNormalization after it become one
mirserve.AddLayerNormalization (onnxruntime's extended level fuses the same pair into its contrib
SkipLayerNormalization, which only onnxruntime runs; this op's function body is the two standard ops).

    S = Add(A, B); Y = LayerNormalization(S, scale[, bias])
        =>  Y = mirserve.AddLayerNormalization(A, B, scale, bias)                  (only the norm reads S)
        =>  Y, S = mirserve.AddLayerNormalizationWithSum(A, B, scale, bias)        (S is read elsewhere too:
                                                                                   a pre-norm block's next residual)

Preconditions: A and B have one known shape, up to leading unit axes (a broadcasting Add is left alone: a
fused kernel adds two tensors of the norm's input shape, over every axis the norm normalizes), float data, the norm's Mean and
InvStdDev outputs unused, a body at the model's opset (LayerNormalization: 17), and a kernel for the op on a
place at least as good as the Add's and the norm's (no rewrite loses placement: ARM runs the op in fp32 only,
OpenCL not at all). Without a bias the op gets a zero one, shaped like the scale. The norm's axis, epsilon and
stash_type are carried over, written even where the model left the default. Where the sum is read elsewhere the
op takes the Add's place, so its scale and bias must be constants. Numeric effect: none (the body is the two
ops it replaces).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from worker.engine.ir import Node, Value
from worker.engine.mirserve_domain.ops import DOMAIN, VERSION
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.mirserve_ops import emit_refusal
from worker.engine.passes.support.placement import constant_facts, placement_refusal, planned_facts
from worker.engine.passes.support.weights import numpy_dtype
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


@dataclass(frozen=True)
class Plan:
    op: str
    #: The sum is read outside the pair: the op gives it as its second output.
    keeps_sum: bool
    attributes: dict


def _show(shape) -> str:
    return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _without_leading_ones(shape) -> tuple:
    """The shape with its leading unit axes dropped: [16, 32] and [1, 16, 32] hold the same elements in the same
    order (GPT-2 adds its residual so), a broadcast in name only."""
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def residual_refusal(a: Value, b: Value) -> str | None:
    """Why the Add of ``a`` and ``b`` is no residual connection a fused kernel computes, or None."""
    if a.shape is None or b.shape is None or any(d is None for d in (*a.shape, *b.shape)):
        return f"the shapes of the Add's operands are not known ({_show(a.shape)} and {_show(b.shape)})"
    if _without_leading_ones(a.shape) != _without_leading_ones(b.shape):
        return (f"the Add broadcasts {_show(a.shape)} with {_show(b.shape)}: the fused op adds two tensors of "
                f"the norm's input shape")
    if a.dtype not in FLOATS or b.dtype != a.dtype:
        return "the Add's operands are not floats of one type"
    return None


class AddLayerNorm(Rule):
    name = "add_layer_norm"

    def build_pattern(self) -> Pattern:
        p = Pattern("add_layer_norm")
        total = p.Add(p.var("a"), p.var("b"), key="add", out="sum").keep()
        p.LayerNormalization(total, p.var("scale"), key="norm", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> Plan | str:
        a, b, total, norm = match.value("a"), match.value("b"), match.value("sum"), match.node("norm")
        refusal = residual_refusal(a, b)
        if refusal:
            return refusal
        keeps_sum = len(total.consumers()) > 1 or total.is_graph_output
        op = "AddLayerNormalizationWithSum" if keeps_sum else "AddLayerNormalization"
        if keeps_sum and not all(v is None or v.is_constant for v in norm.inputs[1:]):
            return (f"the sum is read elsewhere, so the fused op would take the Add's place, but "
                    f"{describe(norm)} reads a computed scale or bias")
        scale = match.value("scale")
        if norm.input(2) is None and scale.shape is None:
            return f"{describe(norm)} has no bias and the shape of its scale is not known"
        refusal = emit_refusal(ctx, op, a.dtype)
        if refusal:
            return refusal
        attributes = {"axis": int(norm.attr("axis", -1)), "epsilon": float(norm.attr("epsilon", 1e-5)),
                      "stash_type": int(norm.attr("stash_type", 1))}
        bias = norm.input(2) if norm.input(2) is not None else constant_facts(scale.dtype, tuple(scale.shape))
        outputs = [match.value("out"), total] if keeps_sum else [match.value("out")]
        facts = planned_facts(op, DOMAIN, VERSION, [a, b, scale, bias], outputs, attributes, norm.name)
        return placement_refusal(ctx, facts, match.nodes) or Plan(op, keeps_sum, attributes)

    def rewrite(self, ctx: PassContext, match: Match, plan: Plan) -> Node:
        graph, norm, scale = match.graph, match.node("norm"), match.value("scale")
        bias = norm.input(2)
        if bias is None:
            bias = graph.add_initializer(f"{norm.name}_zero_bias", np.zeros(scale.shape, numpy_dtype(scale.dtype)))
        outputs = [match.value("out"), match.value("sum")] if plan.keeps_sum else [match.value("out")]
        # With the sum kept, the op computes it where the Add did, before any other reader of it.
        anchor = match.node("add") if plan.keeps_sum else norm
        return graph.add_node(plan.op, [match.value("a"), match.value("b"), scale, bias], outputs, domain=DOMAIN,
                              name=norm.name, before=anchor, attributes=plan.attributes)


@register_pass(name="add_layer_norm_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=2, portable=False,
               description="residual Add + LayerNormalization -> mirserve.AddLayerNormalization (WithSum when "
                           "the sum is read elsewhere)")
def add_layer_norm_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [AddLayerNorm()])
