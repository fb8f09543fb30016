"""eliminate_full_gather: a Gather or GatherND whose constant indices take every element (or slice) of its
data once, in order, is a Reshape of the data.

    mask:[1, 16] -> GatherND(indices = [[0, 0], [0, 1], ..., [0, 15]] as [1, 1, 1, 16, 2]) -> y:[1, 1, 1, 16]
        becomes    mask -> Reshape(1, 1, 1, 16) -> y
    m:[16, 1] -> Gather(axis 0, indices = arange(16) as [1, 1, 1, 16]) -> y    becomes    m -> Reshape -> y

transformers builds its attention masks by indexing the padding mask with broadcast batch and position
aranges (``padding_mask[batch_idx, kv_idx]``); at a static batch and sequence the exporters write that as a
GatherND (dynamo) or a Flatten + Gather (TorchScript) over every element, in order. Exact: index i of the
flattened indices is position i, so the result lists the data's elements in row-major order, which is what a
Reshape to the result's shape does. fuse_consecutive_reshapes then merges it with its neighbours.

Preconditions: indices known offline; the data's shape and the result's static; Gather: the indices,
flattened, are 0 .. n - 1 for the n entries of the axis (negative ones counted from the end); GatherND
(batch_dims 0): they list every k-tuple of the data's first k dims in row-major order.
"""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.shapes import lists_every_position, reshape_instead, static_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

#: The largest index tensor compared with every position (larger ones are left as they are).
MAX_INDICES = 1 << 22


def _every_position(node: Node, indices: np.ndarray, shape: tuple[int, ...]) -> str | None:
    """Why ``indices`` do not take every element of data of ``shape`` once in order, or None."""
    if node.op_type == "Gather":
        axis = int(node.attr("axis", 0)) % len(shape)
        flat = indices.reshape(-1)
        flat = np.where(flat < 0, flat + shape[axis], flat)
        return None if np.array_equal(flat, np.arange(shape[axis])) else \
            "its indices do not take every entry of the axis in order"
    if int(node.attr("batch_dims", 0)) != 0:
        return "it gathers per batch (batch_dims), which this pass does not read"
    if not lists_every_position(indices, shape):
        return "its indices do not take every position of the data in order"
    return None


class FullGather(Rule):
    name = "eliminate_full_gather"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        p.op(("Gather", "GatherND"), p.var("data"), p.var("indices"), key="gather", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> list[int] | str:
        data, result = static_shape(match.value("data")), static_shape(match.value("y"))
        if data is None or result is None or not data:
            return "a shape is not static"
        if 0 in result:
            return "the result is empty"
        indices = match.value("indices").constant_value()
        if indices is None:
            return "its indices are not known offline"
        if indices.size > MAX_INDICES:
            return "its indices are too large to compare with every position"
        reason = _every_position(match.node("gather"), indices, tuple(data))
        return reason if reason is not None else list(result)

    def rewrite(self, ctx: PassContext, match: Match, shape: list[int]) -> Node:
        return reshape_instead(match.node("gather"), match.graph, match.value("data"), match.value("y"), shape)


@register_pass(name="eliminate_full_gather", kind=PassKind.PROGRAM, level=1,
               description="Gather / GatherND whose constant indices take every element in order -> a Reshape "
                           "of the data")
def eliminate_full_gather(ctx: PassContext) -> PassResult:
    if ctx.opset() < 5:
        return PassResult()  # Reshape keeps its shape as an attribute before opset 5
    return apply_rules(ctx, [FullGather()])
