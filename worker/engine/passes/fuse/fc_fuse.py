"""fc_fuse: 2-D MatMul + Add becomes Gemm, and Transposes feeding a Gemm or 2-D MatMul fold into
transA/transB (Paddle-Lite's fc_fuse; onnxoptimizer's fuse_matmul_add_bias_into_gemm and
fuse_transpose_into_gemm).

    Add(MatMul(A, B), C)              ->  Gemm(A, B, C)                  (A, B 2-D; C broadcasts to [M, N])
    MatMul(Transpose(A), B)           ->  Gemm(A, B, transA=1)           (also for B, and both)
    Gemm(Transpose(A), B, ...)        ->  Gemm(A, B, ..., transA=!transA)
    Add(Gemm(A, B[, C]), D)           ->  Gemm(A, B, beta * C + D, beta=1)   (C, if any, and D constants)

Gemm only takes 2-D inputs, so a MatMul whose inputs are not known to be 2-D stays (a 3-D MatMul + Add in a
transformer is refused with its shapes). Before opset 11 Gemm needs C, so a zero scalar is given.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.gemm import broadcast_refusal, gemm, two_d_refusal
from worker.engine.passes.support.weights import f64, fused_name
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


class MatMulAdd(Rule):
    name = "matmul_add"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.MatMul(p.var("a"), p.var("b"), key="matmul", out="y")
        p.Add(y, p.var("c"), key="add", out="out", commutative=True)
        return p

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        if ctx.opset() < 7:
            return "Gemm before opset 7 broadcasts differently"
        return (two_d_refusal(match.node("matmul"), match.value("a"), match.value("b"))
                or broadcast_refusal(match.node("add"), match.value("c"), match.value("y")) or True)

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        inputs = [match.value("a"), match.value("b"), match.value("c")]
        return gemm(match.graph, ctx, inputs, match.value("out"), {}, name=match.node("matmul").name,
                    before=match.node("add"))


class TransposedMatMul(Rule):
    """MatMul of a transposed 2-D input (slot 0 or 1) -> Gemm with transA/transB."""

    pattern_args = ("slot",)

    def __init__(self, slot: int):
        super().__init__()
        self.slot = slot
        self.name = f"transpose_matmul_{'ab'[slot]}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.Transpose(p.var("x"), key="transpose", attrs={"perm": [1, 0]})
        inputs = [t, p.var("other")] if self.slot == 0 else [p.var("other"), t]
        p.MatMul(*inputs, key="matmul", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        return two_d_refusal(match.node("matmul"), match.value("x"), match.value("other")) or True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        x, other = match.value("x"), match.value("other")
        inputs = [x, other] if self.slot == 0 else [other, x]
        attributes = {"transA" if self.slot == 0 else "transB": 1}
        return gemm(match.graph, ctx, inputs, match.value("out"), attributes, name=match.node("matmul").name,
                    before=match.node("matmul"))


class TransposedGemm(Rule):
    """Gemm reading a Transpose(perm=[1, 0]) at A or B -> the same Gemm with that trans flag flipped."""

    pattern_args = ("slot",)

    def __init__(self, slot: int):
        super().__init__()
        self.slot = slot
        self.name = f"transpose_gemm_{'ab'[slot]}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.Transpose(p.var("x"), key="transpose", attrs={"perm": [1, 0]})
        p.Gemm(*([None] * self.slot), t, key="gemm", out="out")
        return p

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        old = match.node("gemm")
        inputs = list(old.inputs)
        inputs[self.slot] = match.value("x")
        flag = "transA" if self.slot == 0 else "transB"
        node = match.graph.add_node("Gemm", inputs, outputs=[match.value("out")], name=old.name,
                                    attributes=dict(old.attributes), before=old)
        node.set_attr(flag, 1 - int(old.attr(flag, 0)))
        return node


class GemmAdd(Rule):
    name = "gemm_add"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.Gemm(p.var("a"), p.var("b"), key="gemm", out="y")
        p.Add(y, p.var("d"), key="add", out="out", commutative=True)
        return p

    def check(self, ctx: PassContext, match: Match) -> str | bool:
        gemm_node, d = match.node("gemm"), match.value("d")
        refusal = broadcast_refusal(match.node("add"), d, match.value("y"))
        if refusal:
            return refusal
        c = gemm_node.input(2)
        if c is not None and (c.constant_value() is None or d.constant_value() is None):
            return f"{describe(gemm_node)} already has a C, and it or the addend {d.name!r} is not a constant"
        return True

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        old, d, graph = match.node("gemm"), match.value("d"), match.graph
        c = old.input(2)
        if c is not None:
            total = float(old.attr("beta", 1.0)) * f64(c.constant_value()) + f64(d.constant_value())
            d = graph.add_initializer(fused_name(c.name), total.astype(d.constant_value().dtype))
        node = graph.add_node("Gemm", [old.input(0), old.input(1), d], outputs=[match.value("out")], name=old.name,
                              attributes=dict(old.attributes), before=match.node("add"))
        node.set_attr("beta", 1.0)
        return node


@register_pass(name="fc_fuse", peer="Paddle-Lite", kind=PassKind.PROGRAM, level=1,
               description="turn 2-D MatMul + Add into Gemm and fold Transposes and a following Add into Gemm")
def fc_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [MatMulAdd(), TransposedMatMul(0), TransposedMatMul(1),
                           TransposedGemm(0), TransposedGemm(1), GemmAdd()])
