"""fuse_reshape_transpose_reshape: a Transpose of the trailing axes written with the leading axes merged
into one and split again is a Transpose of those axes alone (the leading ones reshaped first when they split
otherwise than they were).

    x:[1, 6, 17, 64] -> Reshape(6, 17, 64) -> Transpose(0, 2, 1) -> Reshape(1, 6, 64, 17) -> y
        becomes    x -> Transpose(0, 1, 3, 2) -> y
    x:[1, 1, 6, 17, 64] -> Reshape(6, 17, 64) -> Transpose(0, 2, 1) -> Reshape(1, 6, 64, 17) -> y
        becomes    x -> Reshape(1, 6, 17, 64) -> Transpose(0, 1, 3, 2) -> y

The dynamo exporter writes a batched matmul with a transposed 4-D operand this way (torch decomposes
``q @ k.transpose(-2, -1)`` into a bmm over the merged batch); TorchScript writes the one Transpose that the
attention fusions read. Exact: a Transpose that keeps axis 0 of the merged tensor moves elements within each
leading index, and a row-major Reshape that only merges or splits leading axes keeps every trailing block.

Preconditions: static shapes; the first Reshape keeps x's last m axes and merges the others into one; the
Transpose keeps that axis first; the second Reshape keeps the transposed trailing axes and splits the
leading one into dims of the same product; the intermediates read by nothing else.
"""
from __future__ import annotations

import math

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.shapes import static_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class ReshapeTransposeReshape(Rule):
    name = "fuse_reshape_transpose_reshape"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        merged = p.Reshape(p.var("x"), p.var("merge_shape"), key="merge", out="merged")
        moved = p.Transpose(merged, key="transpose", out="moved")
        p.Reshape(moved, p.var("split_shape"), key="split", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple[list[int], list[int]] | str:
        """(the leading dims of the result, the perm of the result's rank), or why not."""
        x, merged, y = (static_shape(match.value(key)) for key in ("x", "merged", "y"))
        if x is None or merged is None or y is None:
            return "a shape is not static"
        if 0 in x:
            return "the tensor is empty"
        trailing = len(merged) - 1
        if trailing < 1 or len(x) <= trailing or list(x[len(x) - trailing:]) != list(merged[1:]) \
                or math.prod(x[:len(x) - trailing]) != merged[0]:
            return "the first Reshape does not merge the leading axes alone"
        perm = match.node("transpose").attr("perm")
        if perm is None or len(perm) != len(merged) or perm[0] != 0:
            return "the Transpose moves the merged leading axis"
        moved = [merged[axis] for axis in perm[1:]]
        leading = list(y[:len(y) - trailing]) if len(y) > trailing else []
        if list(y[len(y) - trailing:]) != moved or math.prod(leading) != merged[0]:
            return "the second Reshape does not split the leading axis alone"
        lead = len(leading)
        return leading, list(range(lead)) + [lead + axis - 1 for axis in perm[1:]]

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple[list[int], list[int]]) -> Node:
        leading, perm = plan
        graph, x, split = match.graph, match.value("x"), match.node("split")
        source = x
        target = leading + list(static_shape(match.value("merged"))[1:])
        if list(static_shape(x)) != target:  # the leading axes split otherwise than they came
            shape = graph.root.add_initializer(f"{split.name}_leading", np.array(target, dtype=np.int64))
            reshape = graph.add_node("Reshape", [x, shape], [f"{split.name}_leading_out"],
                                     name=f"{split.name}_leading", before=split)
            source = reshape.output(0)
            source.dtype, source.shape = x.dtype, tuple(target)
        return graph.add_node("Transpose", [source], [match.value("y")], attributes={"perm": perm},
                              name=match.node("transpose").name, before=split)


@register_pass(name="fuse_reshape_transpose_reshape", kind=PassKind.PROGRAM, level=1,
               description="Reshape merging leading axes -> Transpose of the trailing ones -> Reshape splitting "
                           "them again -> one Transpose (dynamo's batched matmul with a transposed operand)")
def fuse_reshape_transpose_reshape(ctx: PassContext) -> PassResult:
    if ctx.opset() < 5:
        return PassResult()  # Reshape keeps its shape as an attribute before opset 5
    return apply_rules(ctx, [ReshapeTransposeReshape()])
