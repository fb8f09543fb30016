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

from worker.ir import Graph, Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import per_tensor_params
from worker.passes.eliminate.forward import is_attached
from worker.passes.registry import register_pass

#: Op type -> the first opset at which it takes 8-bit data.
MOVERS = {"Reshape": 5, "Flatten": 9, "Squeeze": 1, "Unsqueeze": 1, "Transpose": 1, "MaxPool": 12}


def _refusal(node: Node, opset: int) -> tuple[Node, Node] | str | None:
    """(DequantizeLinear, QuantizeLinear) around ``node``, or why not (None: not a candidate)."""
    dq = node.input(0).producer if node.input(0) is not None else None
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain != "" or dq.graph is not node.graph:
        return None
    out = node.output(0)
    uses = out.uses
    if len(uses) != 1 or uses[0].node.op_type != "QuantizeLinear" or uses[0].node.domain != "" \
            or uses[0].slot != 0:
        return "its float result is read by other nodes than one QuantizeLinear"
    quant = uses[0].node
    if out.is_graph_output:
        return "its float result is a graph output"
    if opset < MOVERS[node.op_type]:
        return f"{node.op_type} takes 8-bit data from opset {MOVERS[node.op_type]}, the model has {opset}"
    if len(node.outputs) != 1:
        return "it has a second output (MaxPool's Indices)"
    if quant.output(0).dtype != dq.input(0).dtype:
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
    return dq, quant


def _rewrite(graph: Graph, node: Node, dq: Node, quant: Node) -> tuple[Node, list[str]]:
    inputs: list[Value | None] = [dq.input(0), *node.inputs[1:]]
    moved = graph.add_node(node.op_type, inputs, [quant.output(0)], attributes=dict(node.attributes),
                           name=f"{node.name}_8bit", before=node)
    replaced = [node.name, quant.name]
    graph.remove_nodes([node, quant])
    if not dq.output(0).uses and not dq.output(0).is_graph_output:
        replaced.insert(0, dq.name)
        graph.remove_node(dq)
    return moved, replaced


@register_pass(name="eliminate_qdq_around_data_movement", kind=PassKind.PROGRAM, level=1,
               description="DequantizeLinear -> Reshape / Flatten / Squeeze / Unsqueeze / Transpose / MaxPool -> "
                           "QuantizeLinear with equal parameters -> the op on the 8-bit data")
def eliminate_qdq_around_data_movement(ctx: PassContext) -> PassResult:
    result = PassResult()
    opset = ctx.opset("")
    for graph in list(ctx.graph.all_graphs()):
        if not is_attached(graph, ctx.graph):
            continue
        found = [n for op in MOVERS for n in graph.nodes_of_type(op)]
        for node in sorted(found, key=lambda n: n.position):
            if node.graph is not graph:
                continue
            plan = _refusal(node, opset)
            if isinstance(plan, str):
                result.refused(f"eliminate_qdq_around_data_movement: {node.op_type}: {plan}")
            elif plan is not None:
                moved, replaced = _rewrite(graph, node, *plan)
                result.rewrote({"rule": "eliminate_qdq_around_data_movement", "from": replaced,
                                "to": [moved.name]})
    return result
