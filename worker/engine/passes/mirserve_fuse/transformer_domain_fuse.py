"""transformer_domain_fuse: the transformer chains whose standard op the model's opset does not have yet become
ops of the project's domain, each defined by its chain as a function body (onnxruntime's extended level does
the same with its com.microsoft contrib ops, which only onnxruntime runs).

    Gelu chain (erf / tanh)         ->  mirserve.Gelu(x) / mirserve.GeluTanh(x)        (standard Gelu: opset 20)
    RMSNorm chain over the last axis ->  mirserve.RMSNorm(x, scale, epsilon)            (RMSNormalization: 23)
    MatMul(q, kT) [* c] [+ mask]... [Where(b, fill, .)] Softmax, MatMul(., v)
                                    ->  mirserve.ScaledDotProductAttention(q, kT, v, mask, scale)  (Attention: 23)
    ScaledDotProductAttention(T(R(q3)), T'(R(k3)), T(R(v3)), mask) -> T -> R
                                    ->  mirserve.MultiHeadAttention(q3, k3, v3, mask, num_heads, scale)

The chains, and every precondition but the opset, are those of gelu_fuse, rms_norm_fuse and attention_fuse; a
chain whose standard op the model may have is left to those passes (this one says nothing about it), and
``--target-opset`` still gives standard ops. The attention op takes the keys as transposed as the chain reads
them and an additive mask (a zero scalar without one; two masks summed first; a masked_fill's choice as the
mask Where(b, fill, 0), on attention_fuse's preconditions), so its body is the chain itself; grouped-query
repeat_kv stays in front of it. torch's scaled_dot_product_attention decomposed (q and kT each scaled, the
weights guarded by Where(IsNaN(w), 0, w)) becomes the op with the guard on its output: a row of weights all
NaN (every key masked by -inf) is a row of the output all NaN, so both give 0 there wherever the values are
finite. RMSNorm normalizes over the last axis only.
Level 2, skipped with --portable. Refused where the body cannot be written (opset below 13: Softmax over one
axis), where no valid place has a kernel for the op, and where only places outside the first place's memory
have one (a GPU run would copy the chain's data to the host fallback and back). Numeric effect: the body's ops
in place of the chain's (x * x for Pow(x, 2), a division for a reciprocal times, a product by 1 / c for a
division by c): last bits.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.mirserve_domain.ops import DOMAIN, VERSION
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.activations import forms
from worker.engine.passes.support.attention_inputs import HEADS_PERM, ScaledOperand, heads_layout
from worker.engine.passes.support.casts import same_memory
from worker.engine.passes.support.constants import computed_from_constants
from worker.engine.passes.support.mirserve_ops import emit_refusal
from worker.engine.passes.support.normalization import scalar
from worker.engine.passes.support.placement import constant_facts, placement_refusal, planned_facts
from worker.engine.passes.support.standard_ops import standard_op_refusal
from worker.engine.passes.support.transformer_chains import INVERSES, GeluChain, RMSNormChain, ScaledDotProduct
from worker.engine.passes.support.weights import numpy_dtype
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


def _domain_check(rule, ctx: PassContext, match: Match, standard: str, since: int, op: str, dtype: int):
    """None when the standard op may be emitted (its pass's job), else a refusal or the rule's plan. The op
    must run on a place at least as good as the chain's nodes would get (no rewrite loses placement)."""
    if standard_op_refusal(ctx, standard, since) is None:
        return None
    if computed_from_constants(match.nodes):
        return (f"every input of the chain is computed from constants: constant folding computes it, and would "
                f"not compute a {DOMAIN}.{op}")
    plan = emit_refusal(ctx, op, dtype) or off_device_refusal(ctx, op) or rule.plan(ctx, match)
    if plan is None or isinstance(plan, str):
        return plan
    inputs, attributes = rule.operands(match, plan)
    facts = planned_facts(op, DOMAIN, VERSION, inputs, [match.value("out")], attributes, match.nodes[0].name)
    return placement_refusal(ctx, facts, match.nodes) or plan


def off_device_refusal(ctx: PassContext, op: str) -> str | None:
    """Why the op would only run outside the first place's memory (a GPU's chain going to the host fallback and
    its data copied there and back), or None."""
    if ctx.kernels is None or not ctx.places.places:
        return None
    first = ctx.places.places[0].target.name
    running = sorted(t for t in ctx.places.targets if ctx.kernels.has_kernel(op, DOMAIN, [t]))
    if running and not any(same_memory(first, t) for t in running):
        return (f"only {', '.join(running)} has a {DOMAIN}.{op} kernel, outside the memory of {first}: its data "
                f"would be copied there and back")
    return None


class DomainGelu(GeluChain):
    def __init__(self, form):
        super().__init__(form)
        self.name = f"{form.name}_domain"
        self.op = "GeluTanh" if form.kind == "GeluTanh" else "Gelu"

    def check(self, ctx: PassContext, match: Match):
        return _domain_check(self, ctx, match, "Gelu", 20, self.op, match.value("x").dtype)

    def operands(self, match: Match, params) -> tuple[list, dict]:
        return [match.value("x")], {}

    def rewrite(self, ctx: PassContext, match: Match, params) -> Node:
        return match.graph.add_node(self.op, [match.value("x")], outputs=[match.value("out")], domain=DOMAIN,
                                    name=match.node("nonlinear").name, before=match.node("last"))


class DomainRMSNorm(RMSNormChain):
    def __init__(self, square: str, inverse: str, has_scale: bool):
        super().__init__(square, inverse, has_scale)
        self.name = f"{self.name}_domain"

    def check(self, ctx: PassContext, match: Match):
        plan = _domain_check(self, ctx, match, "RMSNormalization", 23, "RMSNorm", match.value("x").dtype)
        if isinstance(plan, int) and not isinstance(plan, bool) and plan != len(match.value("x").shape) - 1:
            return f"{describe(match.node('mean_op'))} normalizes more than the last axis"
        return plan

    def operands(self, match: Match, axis: int) -> tuple[list, dict]:
        x = match.value("x")
        scale = constant_facts(x.dtype, tuple(x.shape[axis:]))
        return [x, scale], {"epsilon": scalar(match.value("eps"))}

    def rewrite(self, ctx: PassContext, match: Match, axis: int) -> Node:
        x, graph, anchor = match.value("x"), match.graph, match.node("normalize")
        scale = self.scale(match, axis)
        return graph.add_node("RMSNorm", [x, scale], outputs=[match.value("out")], name=anchor.name, domain=DOMAIN,
                              before=anchor, attributes={"epsilon": scalar(match.value("eps"))})


class DomainAttention(ScaledDotProduct):
    def __init__(self, scale: str, masks: int, nan_guard: bool = False, fill: str = ""):
        super().__init__(scale, masks, nan_guard=nan_guard, fill=fill)
        self.name = f"{self.name}_domain"

    def check(self, ctx: PassContext, match: Match):
        return _domain_check(self, ctx, match, "Attention", 23, "ScaledDotProductAttention", match.value("q").dtype)

    def operands(self, match: Match, scale: float) -> tuple[list, dict]:
        q = match.value("q")
        if self.masks == 1 and not self.fill:
            mask = match.value("mask0")
        elif self.masks or self.fill:  # made: the masks summed, a fill as a Where among them
            mask = constant_facts(q.dtype, self.mask_shape(match), constant=False)
        else:
            mask = constant_facts(q.dtype, ())
        return [q, match.value("kt"), match.value("v"), mask], {"scale": float(scale)}

    def rewrite(self, ctx: PassContext, match: Match, scale: float) -> list[Node]:
        graph, anchor, q = match.graph, match.node("pv"), match.value("q")
        created = []
        mask = self.mask_value(match, created)
        if mask is None:
            mask = graph.add_initializer(f"{anchor.name}_no_mask", np.zeros((), numpy_dtype(q.dtype)))
        out = match.value("out")
        created.append(graph.add_node("ScaledDotProductAttention", [q, match.value("kt"), match.value("v"), mask],
                                      outputs=[f"{anchor.name}_y" if self.nan_guard else out], name=anchor.name,
                                      domain=DOMAIN, before=anchor, attributes={"scale": float(scale)}))
        if self.nan_guard:  # on the output: a row of weights all NaN is a row of y all NaN (finite values)
            y = created[-1].outputs[0]
            y.dtype, y.shape = out.dtype, out.shape
            created.append(graph.add_node("IsNaN", [y], outputs=1, name=f"{anchor.name}_is_nan", before=anchor))
            created[-1].outputs[0].dtype, created[-1].outputs[0].shape = 9, out.shape
            created.append(graph.add_node("Where", [created[-1].outputs[0], match.value("zero"), y], outputs=[out],
                                          name=f"{anchor.name}_guard", before=anchor))
        return created


KEYS_PERM = [0, 2, 3, 1]  # (batch, seq, heads, size) -> (batch, heads, size, seq): the keys as the scores read them


class DomainHeadsLayout(Rule):
    """The domain attention over heads split out of (batch, seq, hidden) tensors and joined back takes them as
    they are (attention_fuse's HeadsLayout, for the domain op: 8 nodes a layer).

        ScaledDotProductAttention(T(R(q3)), T'(R(k3)), T(R(v3)), mask) -> T -> R
                                            ->  MultiHeadAttention(q3, k3, v3, mask, num_heads, scale)

    (R: Reshape (b, s, h * d) -> (b, s, h, d), T: Transpose (0, 2, 1, 3), T': Transpose (0, 2, 3, 1), the keys
    transposed as the scores read them). The query, key and value heads must be as many (grouped-query
    attention keeps repeat_kv in front of the 4-D op); a Reshape of the joined heads into another shape (GPT-2's
    (batch * seq, hidden)) stays, reading the op's output."""

    name = "attention_heads_layout_domain"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        inputs = [p.Transpose(p.Reshape(p.var(f"{w}3"), None, key=f"{w}_reshape"), key=f"{w}_transpose",
                              attrs={"perm": KEYS_PERM if w == "k" else HEADS_PERM}) for w in "qkv"]
        y4 = p.op("ScaledDotProductAttention", *inputs, p.var("mask"), key="attention", domain=DOMAIN)
        p.Reshape(p.Transpose(y4, key="y_transpose", attrs={"perm": HEADS_PERM}), None, key="y_reshape", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple[int, bool] | str:
        reshaped = heads_layout(match)
        if isinstance(reshaped, str):
            return reshaped
        heads = {match.node(f"{w}_reshape").outputs[0].shape[2] for w in "qkv"}
        if len(heads) != 1:
            return f"{describe(match.node('attention'))} reads fewer key or value heads than query heads"
        attention, (num_heads,) = match.node("attention"), heads
        q3 = match.value("q3")
        refusal = emit_refusal(ctx, "MultiHeadAttention", q3.dtype) or off_device_refusal(ctx, "MultiHeadAttention")
        if refusal:
            return refusal
        joined = match.node("y_reshape").inputs[0]
        y = constant_facts(q3.dtype, (*joined.shape[:2], joined.shape[2] * joined.shape[3]), constant=False)
        facts = planned_facts("MultiHeadAttention", DOMAIN, VERSION,
                              [q3, match.value("k3"), match.value("v3"), match.value("mask")],
                              [match.value("out") if reshaped else y],
                              {"num_heads": num_heads, "scale": attention.attr("scale")}, attention.name)
        return placement_refusal(ctx, facts, match.nodes) or (num_heads, reshaped)

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple[int, bool]) -> list[Node]:
        num_heads, reshaped = plan
        graph, attention, y_reshape = match.graph, match.node("attention"), match.node("y_reshape")
        inputs = [match.value("q3"), match.value("k3"), match.value("v3"), match.value("mask")]
        attributes = {"num_heads": num_heads, "scale": attention.attr("scale")}
        out = match.value("out") if reshaped else f"{attention.name}_heads_joined"
        fused = graph.add_node("MultiHeadAttention", inputs, outputs=[out], name=attention.name, domain=DOMAIN,
                               before=attention, attributes=attributes)
        if reshaped:
            return [fused]
        joined, y = y_reshape.inputs[0], fused.outputs[0]
        y.dtype, y.shape = joined.dtype, (joined.shape[0], joined.shape[1], joined.shape[2] * joined.shape[3])
        again = graph.add_node("Reshape", [y, y_reshape.inputs[1]], outputs=[match.value("out")],
                               name=y_reshape.name, before=y_reshape)
        return [fused, again]


@register_pass(name="transformer_domain_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Gelu, RMSNorm and attention chains whose standard op needs a newer opset -> "
                           "mirserve.Gelu / GeluTanh / RMSNorm / ScaledDotProductAttention (MultiHeadAttention "
                           "over heads split from the hidden size)")
def transformer_domain_fuse(ctx: PassContext) -> PassResult:
    rules = [DomainRMSNorm(square, inverse, has_scale) for has_scale in (True, False)
             for inverse in INVERSES for square in ("pow", "mul")]
    rules += [DomainGelu(form) for form in forms("gelu_erf", "gelu_tanh")]
    scales = ("split", "split_shared", "mul", "div", "none")
    rules += [DomainAttention(scale, masks, nan_guard, fill) for nan_guard in (True, False)
              for masks, fill in ((2, ""), *((m, f) for m in (1, 0) for f in ("if_true", "if_false", "")))
              for scale in scales]
    scaled = [ScaledOperand((DOMAIN, op), slot) for op in ("ScaledDotProductAttention", "MultiHeadAttention")
              for slot in (0, 1)]
    return apply_rules(ctx, [*rules, DomainHeadsLayout(), *scaled])
