"""conv_gemm_replace: a 1x1 Conv on a 1x1 feature map whose output is flattened becomes a Gemm (ncnn's
replace_convolution_with_innerproduct_after_global_pooling / _after_innerproduct).

    Flatten(Conv(x[N, C, 1, 1], W[K, C, 1, 1], B))      ->  Gemm(Flatten(x), W as [K, C], B, transB=1)
    Flatten(Conv(Reshape(z[N, C]) , W, B))              ->  Gemm(z, W as [K, C], B, transB=1)

x typically comes from global pooling, z from a fully connected op. The Flatten (or a Reshape to [N, K]) after
the Conv is required: without it the Gemm's [N, K] output would need a Reshape back to [N, K, 1, 1], one node
more than the Conv, and ONNX has no 1-D blob that the next op could take as ncnn's innerproduct output does.
Refused for grouped or padded convs, non-constant or quantized weights, and inputs not known to be 1x1.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.gemm import gemm
from worker.engine.passes.support.weights import conv_refusal
from worker.engine.passes.support.placement import constant_facts, placement_refusal, planned_facts
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe

RESHAPES = ("Reshape", "Flatten", "Unsqueeze")


def flat_source(x):
    """The 2-D value [N, C] that x (rank 4, 1x1) was reshaped from, if x's only use is the conv."""
    producer = x.producer
    if producer is None or producer.op_type not in RESHAPES or not x.has_single_consumer():
        return None
    source = producer.input(0)
    if source is None or source.rank != 2 or x.shape is None or source.shape != tuple(x.shape[:2]):
        return None
    return source


class FlattenedPointwiseConv(Rule):
    name = "conv_1x1_flatten"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.Conv(p.var("x"), p.var("w"), key="conv")
        p.op(("Flatten", "Reshape"), y, key="flatten", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        conv, x, out = match.node("conv"), match.value("x"), match.value("out")
        refusal = conv_refusal(conv)
        if refusal:
            return refusal
        weight = conv.input(1).constant_value()
        if conv.attr("group", 1) != 1 or any(d != 1 for d in weight.shape[2:]) or any(conv.attr("pads", ())):
            return f"{describe(conv)} is not an unpadded, ungrouped 1x1 convolution"
        if x.shape is None or any(d != 1 for d in x.shape[2:]):
            return f"the input of {describe(conv)} is not known to be 1x1 (shape {x.shape})"
        if out.shape is None or len(out.shape) != 2 or out.shape[1] != weight.shape[0]:
            return f"{describe(match.node('flatten'))} does not flatten the conv output to [N, {weight.shape[0]}]"
        # the Gemm reads x flattened to [N, C] and the weight as a [M, C] matrix
        inputs = [constant_facts(x.dtype, tuple(x.shape[:2]), constant=False),
                  constant_facts(x.dtype, tuple(weight.shape[:2])), conv.input(2)]
        facts = planned_facts("Gemm", "", ctx.opset(""), inputs, [out], {"transB": 1}, conv.name)
        return placement_refusal(ctx, facts, match.nodes) or True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> list[Node]:
        conv, x, graph = match.node("conv"), match.value("x"), match.graph
        weight = conv.input(1).constant_value()
        created, source = [], flat_source(x)  # x's own Reshape goes once unused
        if source is None:
            flat = graph.make_value(f"{x.name}_flat", x.dtype, tuple(x.shape[:2]))
            created.append(graph.add_node("Flatten", [x], outputs=[flat], name=f"{conv.name}_flatten",
                                          attributes={"axis": 1}, before=conv))
            source = flat
        matrix = graph.add_initializer(f"{conv.input(1).name}_matrix", weight.reshape(weight.shape[:2]).copy())
        inputs = [source, matrix] + ([conv.input(2)] if conv.input(2) is not None else [])
        created.append(gemm(graph, ctx, inputs, match.value("out"), {"transB": 1}, name=conv.name,
                            before=match.node("flatten")))
        return created


@register_pass(name="conv_gemm_replace", peer="ncnn", kind=PassKind.PROGRAM, level=2,
               description="replace a flattened 1x1 Conv on a 1x1 feature map (after global pooling or a "
                           "fully connected op) by a Gemm")
def conv_gemm_replace(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [FlattenedPointwiseConv()])
