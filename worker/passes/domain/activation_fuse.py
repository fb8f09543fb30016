"""conv_activation_fuse, gemm_activation_fuse, elementwise_activation_fuse: an op and the activation applied to
its output become one op of the ``mirserve`` domain, which a target runs as one kernel (Paddle-Lite's
conv_activation and elementwise_activation fusions, ncnnoptimize's fuse_*_activation).

    Conv(X, W[, B]) -> act              =>  mirserve.FusedConv<Act>(X, W, B or zeros)
    ConvTranspose(X, W[, B]) -> act     =>  mirserve.FusedConvTranspose<Act>(X, W, B or zeros)
    Gemm(A, B[, C]) -> act              =>  mirserve.FusedGemm<Act>(A, B, C or 0)
    MatMul(A, B) -> act                 =>  mirserve.FusedMatMul<Act>(A, B)
    Add(A, B) or Sum(A, B) -> act       =>  mirserve.FusedAdd<Act>(A, B)

``act`` is any form ``recognize.py`` knows (decomposed HardSwish, Silu and Gelu included). Preconditions: only
the activation reads the op's output and the activation's intermediates; the body exists at the model's opset
for the data's type; some valid place has a kernel for the fused op (when kernel tables are loaded). Every
attribute is written explicitly (the standard op's defaults filled in; auto_pad turned into pads), because
``onnx.reference`` rejects a function call that omits one. Numeric effect: none for single-op activations;
decomposed forms are recomputed in the body's order (last-bit rounding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import helper

from worker.domain import DOMAIN
from worker.ir import Graph, Node, Value
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.domain.ops import BASES, Base, fused_name
from worker.passes.domain.recognize import Recognized, Refused, exclusive_use, recognize
from worker.passes.domain.support import drop_unused_constants, emit_refusal, live_graphs
from worker.passes.registry import register_pass


@dataclass
class Plan:
    inputs: list[Value | None]
    attributes: dict
    #: (slot, shape) of an absent optional input to pass as zeros.
    zeros: tuple[int, tuple[int, ...]] | None = None


# --- attributes, explicit ------------------------------------------------------------------------------
def _unknown_attributes(node: Node, allowed: set[str]) -> str | None:
    unknown = sorted(set(node.attributes) - allowed)
    if unknown:
        return f"it has attribute(s) {', '.join(unknown)}, which the fused op does not carry"
    return None


def _same_pads(node: Node, attrs: dict, upper: bool) -> list[int] | str:
    """Explicit pads for auto_pad SAME_UPPER / SAME_LOWER, from static input and kernel sizes."""
    x, w = node.input(0), node.input(1)
    spatial = x.shape[2:] if x.shape is not None else None
    kernel = w.shape[2:] if w.shape is not None else node.attr("kernel_shape")
    if spatial is None or kernel is None or not all(isinstance(d, int) for d in (*spatial, *kernel)):
        return "auto_pad SAME needs static input and kernel sizes to become explicit pads"
    begins, ends = [], []
    for size, k, stride, dilation in zip(spatial, kernel, attrs["strides"], attrs["dilations"]):
        out = math.ceil(size / stride)
        total = max(0, (out - 1) * stride + (k - 1) * dilation + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


def conv_attributes(node: Node, transpose: bool) -> dict | str:
    base = BASES["ConvTranspose" if transpose else "Conv"]
    refusal = _unknown_attributes(node, set(base.attributes) | {"auto_pad", "kernel_shape", "output_shape"})
    if refusal:
        return refusal
    rank = node.input(1).rank or node.input(0).rank
    if rank is None or rank < 3:
        return "the rank of its weight is unknown"
    k = rank - 2
    attrs = {"dilations": [int(d) for d in node.attr("dilations", [1] * k)], "group": int(node.attr("group", 1)),
             "pads": [int(p) for p in node.attr("pads", [0] * 2 * k)],
             "strides": [int(s) for s in node.attr("strides", [1] * k)]}
    auto_pad = node.attr("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if transpose:
        attrs["output_padding"] = [int(p) for p in node.attr("output_padding", [0] * k)]
        if node.has_attr("output_shape") or auto_pad not in ("NOTSET", "VALID"):
            return "it sets output_shape or auto_pad SAME, and the fused op takes explicit pads only"
    if auto_pad == "VALID":
        attrs["pads"] = [0] * 2 * k
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(node, attrs, upper=auto_pad == "SAME_UPPER")
        if isinstance(pads, str):
            return pads
        attrs["pads"] = pads
    elif auto_pad != "NOTSET":
        return f"its auto_pad {auto_pad!r} is not one ONNX defines"
    return attrs


def _gemm_attributes(node: Node) -> dict | str:
    refusal = _unknown_attributes(node, set(BASES["Gemm"].attributes))
    if refusal:
        return refusal
    return {"alpha": float(node.attr("alpha", 1.0)), "beta": float(node.attr("beta", 1.0)),
            "transA": int(node.attr("transA", 0)), "transB": int(node.attr("transB", 0))}


# --- operands ------------------------------------------------------------------------------------------
def _output_channels(weight: Value, transpose: bool, group: int) -> int | None:
    """Conv weights are [M, C/group, k...], ConvTranspose weights [C, M/group, k...]."""
    shape = weight.shape
    dim = None if shape is None or len(shape) < 2 else shape[1] if transpose else shape[0]
    if not isinstance(dim, int):
        return None
    return dim * group if transpose else dim


def _plan(node: Node, base: Base) -> Plan | str:
    if base.name in ("Conv", "ConvTranspose"):
        attrs = conv_attributes(node, transpose=base.name == "ConvTranspose")
        if isinstance(attrs, str):
            return attrs
        plan = Plan([node.input(0), node.input(1), node.input(2)], attrs)
        if node.input(2) is None:
            channels = _output_channels(node.input(1), base.name == "ConvTranspose", attrs["group"])
            if channels is None:
                return "it has no bias and its weight's shape is unknown, so no zero bias can stand in for it"
            plan.zeros = (2, (channels,))
        return plan
    if base.name == "Gemm":
        attrs = _gemm_attributes(node)
        if isinstance(attrs, str):
            return attrs
        plan = Plan([node.input(0), node.input(1), node.input(2)], attrs)
        if node.input(2) is None:
            plan.zeros = (2, (1,))
        return plan
    refusal = _unknown_attributes(node, set())
    return refusal or Plan([node.input(0), node.input(1)], {})


# --- the fusion ----------------------------------------------------------------------------------------
def fuse_activations(ctx: PassContext, anchors: dict[str, str]) -> PassResult:
    """Fuse every op of ``anchors`` (op type -> base name) with the activation that follows it."""
    result = PassResult()
    opset = ctx.opset("")
    for graph in live_graphs(ctx):
        found = [n for op_type in anchors for n in graph.nodes_of_type(op_type)]
        for node in sorted(found, key=lambda n: n.position):
            if node.graph is graph and (node.op_type != "Sum" or len(node.inputs) == 2):
                _fuse_one(ctx, graph, node, BASES[anchors[node.op_type]], opset, result)
    return result


def _fuse_one(ctx: PassContext, graph: Graph, node: Node, base: Base, opset: int, result: PassResult) -> None:
    y = node.output(0)
    found = recognize(y, opset)
    if found is None:
        return
    op_name = fused_name(base.name, found.kind)
    if isinstance(found, Refused):
        result.refused(f"{op_name}: {found.reason}")
        return
    reason = exclusive_use(y, found) or emit_refusal(ctx, op_name, y.dtype)
    if reason is None and any(n.graph is not graph for n in found.nodes):
        reason = f"the {found.kind} is inside a nested body, and the fused op would have to be in two graphs"
    plan = reason or _plan(node, base)
    if isinstance(plan, str):
        result.refused(f"{op_name}: {plan}")
        return
    _rewrite(graph, node, found, op_name, plan, y.dtype, result)


def _rewrite(graph: Graph, node: Node, found: Recognized, op_name: str, plan: Plan, dtype: int,
             result: PassResult) -> None:
    inputs = list(plan.inputs)
    if plan.zeros is not None:
        slot, shape = plan.zeros
        inputs[slot] = graph.add_initializer(f"{node.name}_zero_bias",
                                             np.zeros(shape, dtype=helper.tensor_dtype_to_np_dtype(dtype)))
    attributes = {**plan.attributes, **found.params}
    fused = graph.add_node(op_name, inputs, [found.output], domain=DOMAIN, attributes=attributes,
                           name=f"{node.name}_{found.kind.lower()}", before=node)
    before = [node.name] + [n.name for n in found.nodes]
    constants = [v for n in found.nodes for v in n.inputs if v is not None and v.constant_value() is not None]
    graph.remove_nodes([node, *found.nodes])
    drop_unused_constants(constants)
    result.rewrote({"rule": op_name, "from": before, "to": [fused.name]})


@register_pass(name="conv_activation_fuse", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Conv / ConvTranspose followed by an activation -> mirserve.FusedConv<Act> / "
                           "FusedConvTranspose<Act>")
def conv_activation_fuse(ctx: PassContext) -> PassResult:
    return fuse_activations(ctx, {"Conv": "Conv", "ConvTranspose": "ConvTranspose"})


@register_pass(name="gemm_activation_fuse", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Gemm / MatMul followed by an activation -> mirserve.FusedGemm<Act> / FusedMatMul<Act>")
def gemm_activation_fuse(ctx: PassContext) -> PassResult:
    return fuse_activations(ctx, {"Gemm": "Gemm", "MatMul": "MatMul"})


@register_pass(name="elementwise_activation_fuse", kind=PassKind.PROGRAM, level=2, portable=False,
               description="Add (or a two-input Sum) followed by an activation -> mirserve.FusedAdd<Act>")
def elementwise_activation_fuse(ctx: PassContext) -> PassResult:
    return fuse_activations(ctx, {"Add": "Add", "Sum": "Add"})
