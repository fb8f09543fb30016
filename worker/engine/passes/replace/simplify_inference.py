"""simplify_inference: a BatchNormalization that no conv or Gemm before it absorbed becomes Mul and/or Add on
folded constants (NNVM's SimplifyInference), where that does not grow the graph.

    BatchNormalization(x, gamma, beta, mean, var)  ->  Add(Mul(x, a), b)
    a = gamma / sqrt(var + epsilon),  b = beta - mean * a,  both shaped [C, 1, ...] to broadcast on axis 1

The Mul is left out when a is all ones, the Add when b is all zeros. As in NNVM, the point is that
fold_scale_axis then folds them into the op that reads them: a Conv takes the Mul into its weights and, if it
does not pad, the Add into its bias (for a padded Conv the Add goes first, as x * a + b = (x + b / a) * a, so
the Mul still meets the Conv); a Gemm takes both. The rewrite is refused when it would leave more nodes than
the one BatchNormalization, e.g. before a Relu. Epsilon is always part of a (a known Paddle-Lite complaint).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.ir import Node
from worker.engine.passes.support.batchnorm import batchnorm_affine, batchnorm_refusal
from worker.engine.passes.support.weights import cast_like, constant_refusal, conv_refusal, numpy_dtype
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules, describe


def absorbing_consumer(match: Match):
    """(consumer, takes_mul, takes_add): whether the one op reading the output folds a Mul / an Add."""
    out = match.value("out")
    consumers = out.consumers()
    if out.is_graph_output or len(consumers) != 1 or len(out.uses) != 1:
        return None, False, False
    node = consumers[0]
    if node.input(0) is not out or node.input(1) is None or constant_refusal(node, 1, "weights"):
        return node, False, False
    if node.op_type == "Conv" and conv_refusal(node) is None:
        unpadded = not any(node.attr("pads", ())) and node.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID")
        return node, True, unpadded
    if node.op_type == "Gemm" and out.rank == 2 and not node.attr("transA", 0):
        return node, True, True
    return node, False, False


@dataclass
class AffinePlan:
    """The replacement: the factors, which of Mul/Add it needs and in which order, and what stays after folding."""

    a: np.ndarray
    b: np.ndarray
    mul: bool
    add: bool
    add_first: bool
    consumer: Node | None
    remaining: int

    def steps(self) -> list[tuple[str, np.ndarray]]:
        steps = [("Add", self.b / self.a), ("Mul", self.a)] if self.add_first else [("Mul", self.a), ("Add", self.b)]
        return [(op, v) for op, v in steps if (self.mul if op == "Mul" else self.add)] or [("Mul", self.a)]


def affine_plan(match: Match) -> AffinePlan:
    a, b = batchnorm_affine(match.node("bn"))
    need_mul, need_add = not np.all(a == 1.0), not np.all(b == 0.0)
    consumer, takes_mul, takes_add = absorbing_consumer(match)
    add_first = need_mul and need_add and takes_mul and not takes_add and bool(np.all(a != 0))
    if add_first:
        remaining = 1  # the Add stays, the Mul then meets the consumer
    elif need_add and not takes_add:
        remaining = need_add + need_mul  # the Add stays and keeps the Mul from the consumer
    else:
        remaining = int(need_mul and not takes_mul)
    return AffinePlan(a, b, need_mul, need_add, add_first, consumer, remaining)


class BatchNormToAffine(Rule):
    name = "batchnorm_to_mul_add"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.BatchNormalization(p.var("x"), key="bn", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> AffinePlan | str:
        bn, x = match.node("bn"), match.value("x")
        if x.rank is None or x.rank < 2:
            return f"the rank of the input of {describe(bn)} is unknown"
        scale = bn.input(1).constant_value()
        refusal = batchnorm_refusal(bn, -1 if scale is None else scale.size)
        if refusal:
            return refusal
        plan = affine_plan(match)
        if plan.remaining > 1:
            reader = describe(plan.consumer) if plan.consumer is not None else "several ops or a graph output"
            return (f"replacing {describe(bn)} by Mul and Add would add a node: its output goes to {reader}, "
                    f"which does not fold both")
        return plan

    def rewrite(self, ctx: PassContext, match: Match, plan: AffinePlan) -> list[Node]:
        bn, x, out, graph = match.node("bn"), match.value("x"), match.value("out"), match.graph
        shape = (plan.a.size,) + (1,) * (x.rank - 2)
        like = np.zeros(0, dtype=numpy_dtype(x.dtype))
        steps = plan.steps()
        nodes, current = [], x
        for i, (op, vector) in enumerate(steps):
            constant = graph.add_initializer(f"{bn.name}_{op.lower()}", cast_like(vector.reshape(shape), like))
            target = out if i == len(steps) - 1 else graph.make_value(f"{bn.name}_{op.lower()}_out", x.dtype, x.shape)
            nodes.append(graph.add_node(op, [current, constant], outputs=[target], name=f"{bn.name}_{op.lower()}",
                                        before=bn))
            current = nodes[-1].output()
        return nodes


@register_pass(name="simplify_inference", peer="NNVM", kind=PassKind.PROGRAM, level=2,
               description="replace a BatchNormalization that nothing absorbed by Mul/Add on folded constants "
                           "where the op after it folds them")
def simplify_inference(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [BatchNormToAffine()])
