"""What every fusion into a ``mirserve`` op checks and cleans up: body, element type, kernel, dead constants."""
from __future__ import annotations

from typing import Iterable, Iterator

from onnx import TensorProto, helper

from worker.domain import DOMAIN
from worker.ir import Graph, Value
from worker.passes.base import PassContext
from worker.passes.domain.ops import body_info


def live_graphs(ctx: PassContext) -> Iterator[Graph]:
    """The main graph and every body still attached to it (a fusion may remove a node holding a body)."""
    for graph in list(ctx.graph.all_graphs()):
        if graph is ctx.graph or (graph.parent is not None and graph.parent.graph is not None):
            yield graph


def emit_refusal(ctx: PassContext, op_name: str, dtype: int) -> str | None:
    """Why ``op_name`` may not be emitted for data of ``dtype`` in this model and these places, or None."""
    opset = ctx.opset("")
    info = body_info(op_name, opset)
    if info.unavailable:
        return f"the {DOMAIN}.{op_name} body cannot be written: {info.unavailable}"
    if dtype == 0:
        return "the element type of its data is unknown"
    if info.float32_only and dtype != TensorProto.FLOAT:
        return (f"its body holds float32 constants, which only EyeLike (opset 9) or CastLike (opset 15) can "
                f"give another type, and the data is {_type_name(dtype)} at opset {opset}")
    if ctx.kernels is not None and not ctx.kernels.has_kernel(op_name, DOMAIN, ctx.places.targets):
        targets = ", ".join(sorted(ctx.places.targets))
        return f"no valid place ({targets}) has a {DOMAIN}.{op_name} kernel"
    return None


def _type_name(dtype: int) -> str:
    return helper.tensor_dtype_to_string(dtype).replace("TensorProto.", "").lower()


def drop_unused_constants(values: Iterable[Value]) -> None:
    """Remove the Constant nodes and initializers among ``values`` that a rewrite left without a use."""
    for value in dict.fromkeys(values):
        if value.uses or value.is_graph_output:
            continue
        producer = value.producer
        if producer is not None and producer.op_type == "Constant" and producer.domain == "":
            if producer.graph is not None:
                producer.graph.remove_node(producer)
        elif value.is_constant and value.graph is not None:
            value.graph.remove_initializer(value)
