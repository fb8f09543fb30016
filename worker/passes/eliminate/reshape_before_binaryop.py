"""eliminate_reshape_before_binaryop: a Reshape (or Flatten/Squeeze/Unsqueeze) that only adds or removes
leading unit axes before an elementwise binary op is skipped; broadcasting does the same.

    b:[C] -> Reshape([1, 1, C]) -> r:[1,1,C] -> Add(x:[N,H,C], r)    becomes    Add(x, b)

(ncnn's eliminate_reshape_before_binaryop.) Broadcasting aligns shapes from the right and pads with leading
ones, so the op sees the same values, provided the two shapes are equal once leading ones are stripped and
the other operand's rank keeps the output's rank. The view op is removed once nothing reads it. Exact.
"""
from __future__ import annotations

from worker.ir import Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.common import remove_dead, same_shape
from worker.passes.eliminate.forward import is_attached
from worker.passes.registry import register_pass

BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
              "GreaterOrEqual", "And", "Or", "Xor", "BitShift")
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _strip_leading_ones(shape) -> tuple:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def redundant_view(view_out: Value, other: Value | None) -> Value | None:
    """The view op's input when reading it instead of ``view_out`` gives the binary op the same result."""
    view = view_out.producer
    if view is None or view.op_type not in VIEW_OPS or view.domain or other is None or other is view_out:
        return None
    source = view.input(0)
    if source is None or source.shape is None or view_out.shape is None or other.shape is None:
        return None
    if not same_shape(_strip_leading_ones(source.shape), _strip_leading_ones(view_out.shape)):
        return None
    if max(other.rank, source.rank) != max(other.rank, view_out.rank):
        return None
    return source


@register_pass(name="eliminate_reshape_before_binaryop", kind=PassKind.PROGRAM, level=1,
               description="skip a Reshape/Unsqueeze before an elementwise binary op that only changes "
                           "leading unit axes")
def eliminate_reshape_before_binaryop(ctx: PassContext) -> PassResult:
    result = PassResult()
    for graph in list(ctx.graph.all_graphs()):
        for op_type in BINARY_OPS:
            for node in graph.nodes_of_type(op_type):
                if node.graph is graph and len(node.inputs) == 2 and is_attached(graph, ctx.graph):
                    _rewire(graph, node, result)
    return result


def _rewire(graph, node: Node, result: PassResult) -> None:
    for slot in (0, 1):
        view_out, other = node.input(slot), node.input(1 - slot)
        source = redundant_view(view_out, other) if view_out is not None else None
        if source is None:
            continue
        view = view_out.producer
        node.set_input(slot, source)
        removed = remove_dead(view.graph, view)  # unless something else still reads the view
        result.rewrote({"rule": "eliminate_reshape_before_binaryop", "from": [view.name, node.name],
                        "to": [node.name] if removed else [view.name, node.name]})
