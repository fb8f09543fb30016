"""eliminate_duplicate_dim_read: a dim the model names, read off whichever value carries it, is read off the
first graph input that declares it, so the reads of one dim become one (common subexpression elimination then
merges them, and whatever they feed: the Ranges of a mask over ``sequence`` computed once per value read).

    x:[batch, sequence, 64] -> Shape -> Gather(1)    becomes    input_ids:[batch, sequence] -> Shape -> Gather(1)

A dynamic TorchScript export reads the batch and sequence off the embeddings, the cast attention mask and the
input ids apart (the transformers library's mask construction, BERT-family encoders, BART's encoder and
decoder): each read a Shape, a Gather and what follows. Exact: a name of the model's (a dim_param, never one
onnx makes up, ``unk__N``) names one size in the whole model, the premise eliminate_shape_op copies dims on.

Preconditions: the Gather reads axis 0 of a Shape (without start and end) of a value whose dim there is a
name some graph input declares; the index a constant scalar or one-element vector. Nodes of the main graph.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from worker.engine.ir import Node
from worker.engine.ir.value import nameable
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


def declared_dims(graph) -> dict[str, tuple]:
    """Each dim name of the graph's inputs -> (the first input declaring it, its position there)."""
    found: dict[str, tuple] = {}
    for value in graph.inputs:
        if value.is_initializer or value.shape is None:
            continue
        for position, dim in enumerate(value.shape):
            if isinstance(dim, str) and nameable(dim):
                found.setdefault(dim, (value, position))
    return found


class DimReadOffInput(Rule):
    name = "eliminate_duplicate_dim_read"

    def __init__(self, declared: dict[str, tuple]):
        super().__init__()
        self.declared = declared

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        shape = p.Shape(p.var("x"), key="shape").keep()
        p.Gather(shape, p.var("index"), key="gather", out="dim")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple | None:
        """(the input, its position) to read the dim off, or None (nothing to do, no refusal)."""
        x, shape, gather = match.value("x"), match.node("shape"), match.node("gather")
        index = match.value("index").constant_value()
        if match.graph is not ctx.graph or shape.attr("start") is not None or shape.attr("end") is not None or \
                gather.attr("axis", 0) != 0 or index is None or index.size != 1 or index.ndim > 1 or \
                x.shape is None:
            return None
        position = int(index.reshape(-1)[0])
        position += len(x.shape) if position < 0 else 0
        if not 0 <= position < len(x.shape):
            return None
        source = self.declared.get(x.shape[position]) if isinstance(x.shape[position], str) else None
        if source is None or (source[0] is x and source[1] == position):
            return None
        return source[0], source[1], index.ndim

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple) -> list[Node]:
        source, position, rank = plan
        graph, gather = match.graph, match.node("gather")
        shape = graph.add_node("Shape", [source], [f"{source.name}_shape"], name=f"{gather.name}_input_shape",
                               before=gather)
        shape.output(0).dtype, shape.output(0).shape = TensorProto.INT64, (len(source.shape),)
        index = graph.root.add_initializer(f"{source.name}_dim{position}",
                                           np.array(position if rank == 0 else [position], np.int64))
        read = graph.add_node("Gather", [shape.output(0), index], [match.value("dim")], name=gather.name,
                              attributes={"axis": 0}, before=gather)
        return [shape, read]


@register_pass(name="eliminate_duplicate_dim_read", kind=PassKind.PROGRAM, level=1,
               description="read a dim the model names off the first graph input declaring it, so the reads of "
                           "one dim merge")
def eliminate_duplicate_dim_read(ctx: PassContext) -> PassResult:
    declared = declared_dims(ctx.graph)
    if not declared:
        return PassResult()
    return apply_rules(ctx, [DimReadOffInput(declared)])
