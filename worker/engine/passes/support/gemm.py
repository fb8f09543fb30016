"""Building a Gemm and the refusals every fusion into one shares: 2-D float inputs, a C that broadcasts to
[M, N]. Used by fc_fuse, gemm_bn_fuse and conv_gemm_replace."""
from __future__ import annotations

import numpy as np

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext
from worker.engine.passes.support.weights import FLOAT_TYPES, numpy_dtype
from worker.engine.pattern import describe


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
