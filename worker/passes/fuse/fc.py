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

import numpy as np

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.fuse.rewrite import FusionRule, describe, fused_name, graph_of, run_rules
from worker.passes.fuse.weights import FLOAT_TYPES, f64, numpy_dtype
from worker.passes.registry import register_pass
from worker.pattern import Match, Pattern


def shape_text(value: Value) -> str:
    return "unknown" if value.shape is None else "[" + ", ".join(str(d) for d in value.shape) + "]"


def two_d_refusal(node: Node, *values: Value) -> str | None:
    for value in values:
        if value.rank != 2:
            return f"{describe(node)} has an input of shape {shape_text(value)}, and Gemm takes 2-D inputs only"
        if value.dtype not in FLOAT_TYPES:
            return f"{describe(node)} computes on a non-float type, which this fusion leaves alone"
    return None


def broadcast_refusal(add: Node, addend: Value, out: Value) -> str | None:
    """Gemm's C must broadcast one way to [M, N] without enlarging it."""
    fits = addend.shape is not None and out.shape is not None and addend.rank <= 2 and all(
        dim in (1, full) for dim, full in zip(reversed(addend.shape), reversed(out.shape)))
    if not fits:
        return f"the addend {addend.name!r} of {describe(add)} has shape {shape_text(addend)}, not one Gemm's C takes"
    return None


def gemm(graph, ctx: PassContext, inputs: list, output: Value, attributes: dict, *, name: str, before: Node) -> Node:
    """A Gemm node; before opset 11, where C is required, a zero scalar C is added when there is none."""
    if len(inputs) < 3 and ctx.opset() < 11:
        like = inputs[0]
        zero = np.zeros((), dtype=numpy_dtype(like.dtype))
        inputs = [*inputs, graph.add_initializer(f"{name}_zero_bias", zero)]
    return graph.add_node("Gemm", inputs, outputs=[output], name=name, attributes=attributes, before=before)


class MatMulAdd(FusionRule):
    name = "matmul_add"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.var("y")
        p.op("matmul", "MatMul", inputs=[p.var("a"), p.var("b")], outputs=[y])
        p.op("add", "Add", inputs=[y, p.var("c")], outputs=[p.var("out")], commutative=True)
        return p

    def check(self, ctx: PassContext, match: Match) -> str | None:
        if ctx.opset() < 7:
            return "Gemm before opset 7 broadcasts differently"
        return (two_d_refusal(match.node("matmul"), match.value("a"), match.value("b"))
                or broadcast_refusal(match.node("add"), match.value("c"), match.value("y")))

    def rewrite(self, ctx: PassContext, match: Match):
        inputs = [match.value("a"), match.value("b"), match.value("c")]
        return gemm(graph_of(match), ctx, inputs, match.value("out"), {}, name=match.node("matmul").name,
                    before=match.node("add"))


class TransposedMatMul(FusionRule):
    """MatMul of a transposed 2-D input (slot 0 or 1) -> Gemm with transA/transB."""

    def __init__(self, slot: int):
        super().__init__()
        self.slot = slot
        self.name = f"transpose_matmul_{'ab'[slot]}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.var("t")
        p.op("transpose", "Transpose", inputs=[p.var("x")], outputs=[t]).attr("perm", [1, 0])
        inputs = [t, p.var("other")] if self.slot == 0 else [p.var("other"), t]
        p.op("matmul", "MatMul", inputs=inputs, outputs=[p.var("out")])
        return p

    def check(self, ctx: PassContext, match: Match) -> str | None:
        return two_d_refusal(match.node("matmul"), match.value("x"), match.value("other"))

    def rewrite(self, ctx: PassContext, match: Match):
        x, other = match.value("x"), match.value("other")
        inputs = [x, other] if self.slot == 0 else [other, x]
        attributes = {"transA" if self.slot == 0 else "transB": 1}
        return gemm(graph_of(match), ctx, inputs, match.value("out"), attributes, name=match.node("matmul").name,
                    before=match.node("matmul"))


class TransposedGemm(FusionRule):
    """Gemm reading a Transpose(perm=[1, 0]) at A or B -> the same Gemm with that trans flag flipped."""

    def __init__(self, slot: int):
        super().__init__()
        self.slot = slot
        self.name = f"transpose_gemm_{'ab'[slot]}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        t = p.var("t")
        p.op("transpose", "Transpose", inputs=[p.var("x")], outputs=[t]).attr("perm", [1, 0])
        p.op("gemm", "Gemm", inputs={self.slot: t}, outputs=[p.var("out")])
        return p

    def rewrite(self, ctx: PassContext, match: Match):
        old = match.node("gemm")
        inputs = list(old.inputs)
        inputs[self.slot] = match.value("x")
        flag = "transA" if self.slot == 0 else "transB"
        node = graph_of(match).add_node("Gemm", inputs, outputs=[match.value("out")], name=old.name,
                                        attributes=dict(old.attributes), before=old)
        node.set_attr(flag, 1 - int(old.attr(flag, 0)))
        return node


class GemmAdd(FusionRule):
    name = "gemm_add"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        y = p.var("y")
        p.op("gemm", "Gemm", inputs=[p.var("a"), p.var("b")], outputs=[y])
        p.op("add", "Add", inputs=[y, p.var("d")], outputs=[p.var("out")], commutative=True)
        return p

    def check(self, ctx: PassContext, match: Match) -> str | None:
        gemm_node, d = match.node("gemm"), match.value("d")
        refusal = broadcast_refusal(match.node("add"), d, match.value("y"))
        if refusal:
            return refusal
        c = gemm_node.input(2)
        if c is not None and (c.constant_value() is None or d.constant_value() is None):
            return f"{describe(gemm_node)} already has a C, and it or the addend {d.name!r} is not a constant"
        return None

    def rewrite(self, ctx: PassContext, match: Match):
        old, d, graph = match.node("gemm"), match.value("d"), graph_of(match)
        c = old.input(2)
        if c is not None:
            total = float(old.attr("beta", 1.0)) * f64(c.constant_value()) + f64(d.constant_value())
            d = graph.add_initializer(fused_name(c.name), total.astype(d.constant_value().dtype))
            self.orphan(c, match.value("d"))
        node = graph.add_node("Gemm", [old.input(0), old.input(1), d], outputs=[match.value("out")], name=old.name,
                              attributes=dict(old.attributes), before=match.node("add"))
        node.set_attr("beta", 1.0)
        return node


@register_pass(name="fc_fuse", kind=PassKind.PROGRAM, level=1,
               description="turn 2-D MatMul + Add into Gemm and fold Transposes and a following Add into Gemm")
def fc_fuse(ctx: PassContext) -> PassResult:
    return run_rules(ctx, [MatMulAdd(), TransposedMatMul(0), TransposedMatMul(1),
                           TransposedGemm(0), TransposedGemm(1), GemmAdd()])
