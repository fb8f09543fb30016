"""fp16_storage (ncnnoptimize's storage flag): float weights are stored as fp16 in the file.

    w (fp32 constant) -> Conv (x86 fp32)     ->  w16 (fp16 initializer) -> calib(float) -> Conv
    w16 (already fp16) -> Conv (arm fp16)    ->  unchanged

Only weights that are data of a computation (inputs a kernel declares in its own precision) are stored
as fp16; scales, regions of interest and other parameters keep their type. A consumer whose kernel needs
fp32 reads the weight through one calib (per weight and target), so the file is about half the size while
the kernels compute as before. A weight with finite values beyond fp16's range stays fp32 (fp16 would
turn them into infinities), as does one named in ``PassContext.kept_fp32_weights`` (the storage fallback's:
after verification failed with every weight in fp16, the fewest weights kept in fp32 for the output to
verify; ``worker.engine.api``). Runs only when the run asks for it (``fp16_storage``).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from worker.engine.ir import Graph, Value
from worker.engine.kernels import SAME
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.casts import cast_kernel, fits_fp16, insert_cast
from worker.engine.passes.support.placement import is_constant
from worker.engine.places import Place, Precision


def _weight_uses(value: Value) -> bool:
    """Every use is a port the kernel declares in its own precision (a weight, not a parameter)."""
    for use in value.uses:
        pick = use.node.pick
        if pick is None:
            return False
        port = pick.kernel.input_port(use.slot)
        if port is None or port.precision != SAME:
            return False
    return bool(value.uses)


def float_constants(graph: Graph) -> list[Value]:
    found = []
    for value in list(graph.initializers.values()):
        if not value.is_graph_input:
            found.append(value)
    for node in graph:
        if node.op_type == "Constant" and node.domain == "":
            found.append(node.output())
    return [v for v in found if v.dtype == TensorProto.FLOAT and is_constant(v) and _weight_uses(v)
            and fits_fp16(v.constant_value())]


def store_half(ctx: PassContext, value: Value) -> int:
    """Replace one fp32 weight by its fp16 copy and a calib per consumer target; returns calibs made."""
    graph = ctx.graph
    half = graph.add_initializer(f"{value.name}_fp16", np.asarray(value.constant_value()).astype(np.float16))
    ctx.stored_half[half.name] = value.name
    made: dict[str, Value] = {}
    for use in list(value.uses):
        node, slot = use.node, use.slot
        pick = node.pick
        target = pick.input(slot).target
        place = value.place or Place(pick.place.target, Precision.FP32, pick.place.layout)
        half.place = Place(place.target, Precision.FP16, place.layout)
        if target not in made:
            kernel = cast_kernel(ctx.kernels, "calib", target, "fp16_to_fp32")
            # a body node's calib goes before the If/Loop/Scan that holds the body (its weight is outside)
            made[target] = insert_cast(graph, half, "calib", {"to": TensorProto.FLOAT},
                                       Place(half.place.target, Precision.FP32, place.layout), kernel,
                                       before=graph.ancestor_in(node), dtype=TensorProto.FLOAT,
                                       shape=half.shape, portable=ctx.options.portable)
        node.set_input(slot, made[target])
    graph.remove_unused([value])
    return len(made)


@register_pass(name="fp16_storage", peer="ncnn", kind=PassKind.PROGRAM, level=1,
               description="store float weights as fp16 in the file, with a calib to fp32 where a kernel "
                           "needs fp32 (only with the fp16_storage option)")
def fp16_storage(ctx: PassContext) -> PassResult:
    result = PassResult()
    if not ctx.options.fp16_storage:
        result.data["fp16_storage"] = "not requested"
        return result
    graph = ctx.graph
    before = _float_bytes(graph)
    calibs = 0
    kept = []
    for value in float_constants(graph):
        if value.name in ctx.kept_fp32_weights:
            kept.append(value.name)
            continue
        calibs += store_half(ctx, value)
        result.rewrote()
    result.data.update(weight_bytes_before=before, weight_bytes_after=_float_bytes(graph), calibs=calibs)
    if kept:
        result.data["kept_fp32"] = kept
    return result


def _float_bytes(graph: Graph) -> int:
    """Bytes of float weights (initializers and Constant nodes) in the graph."""
    total = 0
    for value in graph.initializers.values():
        if value.dtype in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            total += value.nbytes
    for node in graph:
        if node.op_type == "Constant" and node.domain == "" and node.output().dtype in (
                TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            data = node.constant_output()
            total += 0 if data is None else int(np.asarray(data).nbytes)
    return total
