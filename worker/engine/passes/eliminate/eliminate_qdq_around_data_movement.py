"""eliminate_qdq_around_data_movement: an op that only moves or selects elements, between a DequantizeLinear
and a QuantizeLinear with the same scale and zero point, runs on the 8-bit data itself (onnxruntime's
DropQDQNodes rule).

    x_q -> DQ(s, z) -> Reshape -> Q(s, z) -> y_q    becomes    x_q -> Reshape -> y_q

for Reshape, Flatten, Squeeze, Unsqueeze, Transpose and MaxPool (opset 12 or later, where it takes 8-bit
data). Exact: with equal parameters Q(DQ(x)) = x (the round trip (x - z) * s / s stays within an ulp of an
integer), and a positive scale makes dequantization monotonic, so the max of the dequantized values is the
dequantized max. Preconditions: per-tensor scale and zero point known offline and equal on both sides, a
positive scale, the op's float result read only by that QuantizeLinear and no graph output, the
QuantizeLinear writing the DequantizeLinear's input type. A DequantizeLinear other nodes read stays.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import per_tensor_params
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

#: Op type -> the first opset at which it takes 8-bit data.
MOVERS = {"Reshape": 5, "Flatten": 9, "Squeeze": 1, "Unsqueeze": 1, "Transpose": 1, "MaxPool": 12}


class QdqAroundDataMovement(Rule):
    name = "eliminate_qdq_around_data_movement"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        dequantized = p.DequantizeLinear(p.var("x_q"), key="dq", out="x").keep()  # other readers keep it
        moved = p.op(tuple(MOVERS), dequantized, key="op", out="moved")
        p.QuantizeLinear(moved, key="quant", out="y_q")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        reason = _refusal(match, ctx.opset(""))
        return True if reason is None else f"{match.node('op').op_type}: {reason}"

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        node = match.node("op")
        inputs: list[Value | None] = [match.value("x_q"), *node.inputs[1:]]
        return match.graph.add_node(node.op_type, inputs, [match.value("y_q")], attributes=dict(node.attributes),
                                    name=f"{node.name}_8bit", before=node)


def _refusal(match: Match, opset: int) -> str | None:
    node, dq, quant = match.node("op"), match.node("dq"), match.node("quant")
    if opset < MOVERS[node.op_type]:
        return f"{node.op_type} takes 8-bit data from opset {MOVERS[node.op_type]}, the model has {opset}"
    if len(node.outputs) != 1:
        return "it has a second output (MaxPool's Indices)"
    if match.value("y_q").dtype != match.value("x_q").dtype:
        return "the QuantizeLinear writes another type than the DequantizeLinear reads"
    before, after = per_tensor_params(dq), per_tensor_params(quant)
    if before is None or after is None:
        return "a scale or zero point is per axis or not known offline"
    if set(dq.attributes) - {"axis"} or set(quant.attributes) - {"axis"}:
        return "a DequantizeLinear or QuantizeLinear sets attributes beyond axis"
    (s1, z1), (s2, z2) = before, after
    zero1 = np.zeros((), np.int64) if z1 is None else z1.astype(np.int64)
    zero2 = np.zeros((), np.int64) if z2 is None else z2.astype(np.int64)
    if s1.dtype != s2.dtype or s1.reshape(()) != s2.reshape(()) or zero1.reshape(()) != zero2.reshape(()):
        return "the scales or zero points on the two sides differ"
    if not float(s1.reshape(())) > 0:
        return "the scale is not positive"
    return None


@register_pass(name="eliminate_qdq_around_data_movement", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="DequantizeLinear -> Reshape / Flatten / Squeeze / Unsqueeze / Transpose / MaxPool -> "
                           "QuantizeLinear with equal parameters -> the op on the 8-bit data")
def eliminate_qdq_around_data_movement(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [QdqAroundDataMovement()])
