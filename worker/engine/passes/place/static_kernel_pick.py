"""static_kernel_pick: choose, for every node, the kernel of the valid places that scores best.

    Conv(x, w)            ->  Conv(x, w)   node.pick: arm:Conv:1-21:fp16:nhwc, score 1784
    DQ -> Conv -> Q       ->  same nodes,  node.pick: arm:QLinearConv:10-:int8:nchw (absorbed later)

Nodes are visited in execution order; each candidate is checked (opset, element types, attribute
constraints: a refusal is a sentence), resolved against the node's inputs as they will arrive (a picked
producer's output precision and layout), and graded with Paddle-Lite's score (worker.engine.kernels.pick). The
trace keeps, for every node, its top candidates with their scores. A node with no applicable candidate
fails the run with the reasons each candidate gave. Nodes inside If/Loop/Scan bodies run with their parent
node: they get the best kernel of the parent's target that takes their values as they are, or the host's.
"""
from __future__ import annotations

import dataclasses

from typing import NamedTuple

from onnx import TensorProto

from worker.engine.errors import UnsupportedOpsError
from worker.engine.ir import Graph, Node, Value
from worker.engine.kernels import KernelTable
from worker.engine.kernels.ops import nhwc_slots
from worker.engine.kernels.pick import NodeFacts, Pick, Scored, ValueFacts, rank, refusal
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support import qdq
from worker.engine.passes.support.casts import fits_fp16
from worker.engine.passes.support.nhwc import nhwc_form, nhwc_refusal
from worker.engine.passes.support.placement import annotate, is_constant, node_facts, node_opset
from worker.engine.places import Layout, Precision, ValidPlaces, get_target, parse_places, precision_of_dtype

TOP = 3


class Candidate(NamedTuple):
    """One applicable kernel for a node, graded, with the Q/DQ sandwich it absorbs (int8 forms) or None."""

    scored: Scored
    qdq: qdq.Sandwich | None = None

    @property
    def pick(self) -> Pick:
        return Pick(self.scored.resolved, self.qdq)

    def sort_key(self) -> tuple:
        """Best first; equal scores: the user's place order, the float form before the quantized one, then
        table order."""
        return (-self.scored.score, self.scored.place_index, self.qdq is not None, self.scored.order)


def candidates_for(table: KernelTable, node: Node, opset: int, places: ValidPlaces, current,
                   portable: bool = False, fits: dict | None = None, ranks: dict | None = None
                   ) -> tuple[list[Candidate], list[str]]:
    """Applicable candidates best first and the refusals.

    ``ranks`` remembers the ranking of each distinct (op, facts) within one pass: a model repeats the same
    few node signatures hundreds of times, and ranking depends on nothing else.
    """
    fits = {} if fits is None else fits
    facts = node_facts(node, opset, current)
    if node.subgraphs():
        facts = _as_the_body_takes(node, facts)
    key = _rank_key(facts)
    if ranks is not None and key is not None and key in ranks:
        scored, refused = ranks[key]
    else:
        kernels = table.kernels(node.op_type, node.domain, opset=opset, targets=places.targets)
        scored, refused = rank(kernels, facts, places)
        if ranks is not None and key is not None:
            ranks[key] = scored, refused
    found = [Candidate(s) for s in scored]
    reasons = [reason for _, reason in refused]
    sandwich = qdq.find(node)
    if sandwich is not None:
        qkernels = table.kernels(sandwich.qop, "", opset=opset, targets=places.targets)
        qscored, qrefused = rank(qkernels, qdq.facts(sandwich, opset), places)
        found += [Candidate(s, sandwich) for s in qscored]
        reasons += [reason for _, reason in qrefused]
    kept = []
    for candidate in found:
        reason = _form_refusal(candidate.scored, node, opset, portable, fits)
        if reason:
            reasons.append(reason)
        else:
            kept.append(candidate)
    if not kept and any(c.scored.resolved.precision is Precision.FP16 for c in found) \
            and qdq.in_quantized_region(node):
        kept = _in_fp32(table, node, facts, places, portable, fits)
    stuck = _unmovable(table, node, opset)
    if stuck is not None:  # such a value could not get to or from a device's memory
        reasons += [f"{c.scored.kernel.id} runs in {get_target(c.scored.kernel.target).memory_space} memory, "
                    f"and {stuck}" for c in kept if get_target(c.scored.kernel.target).memory_space != "host"]
        kept = [c for c in kept if get_target(c.scored.kernel.target).memory_space == "host"]
    kept.sort(key=Candidate.sort_key)
    return kept, reasons


def _unmovable(table: KernelTable, node: Node, opset: int) -> str | None:
    """Why a value the node reads or writes could not be copied between memories, or None: io_copy's function
    body is an Identity, which the reference runtime's kernel table (x86, onnxruntime's CPU registry) must
    take for the value's element type at the model's opset (onnxruntime's Identity-25 takes no int4)."""
    for value in [*node.inputs, *node.outputs]:
        if value is None or not value.dtype or value.type_proto is not None or value.dtype in _MOVABLE_ALWAYS:
            continue
        key = (id(table), value.dtype, opset)
        if key not in _MOVABLE:
            facts = ValueFacts(dtype=value.dtype)
            identity = NodeFacts("Identity", "", opset, (facts,), (facts,))
            kernels = table.kernels("Identity", "", opset=opset, targets=["x86"])
            _MOVABLE[key] = not kernels or any(refusal(k, identity) is None for k in kernels)
        if not _MOVABLE[key]:
            element = TensorProto.DataType.Name(value.dtype).lower()
            return (f"{value.name} ({element}) could not be copied to or from it: io_copy's body, Identity, has "
                    f"no onnxruntime kernel for {element} at opset {opset}")
    return None


#: Element types every runtime copies; others are checked against the reference runtime's Identity kernels.
_MOVABLE_ALWAYS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64,
                             TensorProto.INT32, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL})
_MOVABLE: dict[tuple, bool] = {}


def _as_the_body_takes(node: Node, facts):
    """A Loop's or Scan's inputs at the precision of the body inputs they become (bodies run in their own
    types, never converted: an fp16 value a body declares float comes in through a calib)."""
    body = node.subgraphs()[0]
    if node.op_type not in ("Loop", "Scan") or len(body.inputs) < len(facts.inputs):
        return facts
    inputs = tuple(v if v is None or v.precision not in (Precision.FP16, Precision.FP32)
                   or precision_of_dtype(inner.dtype) not in (Precision.FP16, Precision.FP32)
                   else dataclasses.replace(v, precision=precision_of_dtype(inner.dtype))
                   for v, inner in zip(facts.inputs, body.inputs))
    return dataclasses.replace(facts, inputs=inputs)


def _in_fp32(table: KernelTable, node: Node, facts, places: ValidPlaces, portable: bool,
             fits: dict) -> list[Candidate]:
    """The candidates again with the node's fp16 inputs taken in fp32 (a calib converts them): a kernel of
    any precision follows its inputs into fp16, which a node next to int8-quantized data may not compute in."""
    as_fp32 = dataclasses.replace(facts, inputs=tuple(
        dataclasses.replace(v, precision=Precision.FP32) if v is not None and v.precision is Precision.FP16
        else v for v in facts.inputs))
    kernels = table.kernels(node.op_type, node.domain, opset=facts.opset, targets=places.targets)
    scored, _ = rank(kernels, as_fp32, places)
    return [Candidate(s) for s in scored
            if s.resolved.precision is not Precision.FP16 and not _form_refusal(s, node, facts.opset, portable, fits)]


def _rank_key(facts) -> tuple | None:
    """``facts`` without the node's name, hashable; None when an attribute value is not (a tensor)."""
    try:
        attributes = tuple(sorted((k, _frozen(v)) for k, v in facts.attributes.items()))
        key = (facts.op, facts.domain, facts.opset, facts.inputs, facts.outputs, attributes)
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _form_refusal(item: Scored, node: Node, opset: int, portable: bool, fits: dict) -> str | None:
    """Whether the node can be written in the form the kernel needs, and computed in its precision."""
    kernel = item.kernel
    if item.resolved.precision is Precision.FP16 and qdq.in_quantized_region(node):
        return (f"{kernel.id} computes in fp16, but the node reads or writes int8-quantized data whose "
                f"scales were calibrated in fp32: it runs in fp32 or int8")
    for slot, value in enumerate(node.inputs):
        if (value is not None and slot < len(item.resolved.inputs) and item.resolved.inputs[slot].precision is Precision.FP16
                and value.dtype == 1 and not _fits_fp16(value, fits)):
            return f"{kernel.id} needs {value.name} in fp16, whose values exceed fp16's range (65504)"
    if kernel.layout is not Layout.NHWC or kernel.op != node.op_type or nhwc_slots(node.op_type, node.domain) is None:
        return None
    if portable:
        return f"{kernel.id} needs the node's NHWC form, an own-domain op, and the output must be portable"
    used = max((slot + 1 for slot, v in enumerate(node.outputs) if v.is_used), default=0)
    reason = nhwc_refusal(nhwc_form(node.op_type, node.domain, opset),
                          {name: attr.value for name, attr in node.attributes.items()}, used, len(node.inputs))
    return f"{kernel.id}: {reason}" if reason else None


def _fits_fp16(value: Value, cache: dict) -> bool:
    """A weight's finite values fit in fp16 (non-constants are not known offline: assumed to fit)."""
    if not is_constant(value):
        return True
    if value not in cache:
        cache[value] = fits_fp16(value.constant_value())
    return cache[value]


def _outputs_of(pick: Pick, node: Node, current: dict) -> None:
    for slot, value in enumerate(node.outputs):
        port = pick.output(slot)
        precision, layout = port.precision, port.layout
        if precision is Precision.ANY:
            precision = current.get(value, (None, None))[0] or precision_of_dtype(value.dtype)
        if layout is Layout.ANY or value.rank != 4:
            layout = Layout.NCHW
        current[value] = (precision, layout)


def _trace(node: Node, ranked: list[Candidate]) -> dict:
    best = ranked[0]
    return {"node": node.name, "op": node.op_type if not node.domain else f"{node.domain}.{node.op_type}",
            "kernel": best.scored.kernel.id, "place": str(best.pick.place),
            "candidates": [{"kernel": c.scored.kernel.id, "score": round(c.scored.score, 3)} for c in ranked[:TOP]]}


@register_pass(name="static_kernel_pick", peer="Paddle-Lite", kind=PassKind.STMT, level=1,
               description="pick each node's kernel by Paddle-Lite's score over the valid places "
                           "(target > precision > layout, place priority), ties by the user's order")
def static_kernel_pick(ctx: PassContext) -> PassResult:
    result = PassResult()
    current: dict[Value, tuple] = {}
    failures: dict[str, dict] = {}
    portable, fits, ranks = ctx.options.portable, {}, {}
    for node in ctx.graph:
        opset = node_opset(ctx.model.opset, node)
        ranked, reasons = candidates_for(ctx.kernels, node, opset, ctx.places, current, portable, fits, ranks)
        if node.name in ctx.pinned_fp32:
            ranked = _pinned(ranked, ctx, node, opset, current, portable, fits)
        if not ranked:
            entry = failures.setdefault(node.op_type if not node.domain else f"{node.domain}.{node.op_type}",
                                        {"nodes": [], "reasons": reasons[:4]})
            entry["nodes"].append(node.name)
            continue
        pick = ranked[0].pick
        annotate(node, pick)
        _outputs_of(pick, node, current)
        result.details.append(_trace(node, ranked))
        for body in node.subgraphs():
            _pick_body(body, pick, ctx)
    if failures:
        ctx.report["pick_failures"] = failures  # --check-support reports them per op type and stops here
        if not ctx.options.check_support_only:
            raise UnsupportedOpsError(_no_kernel_message(failures, ctx.places))
    result.data["picked"] = len(result.details)
    return result


def _pinned(ranked: list[Candidate], ctx: PassContext, node: Node, opset: int, current, portable: bool,
            fits: dict) -> list[Candidate]:
    """A pinned node's candidates that do not compute in fp16 (its fp16 inputs taken in fp32 when the kernels
    follow their inputs' precision); its own candidates when it has no other (it cannot be pinned)."""
    kept = [c for c in ranked if c.scored.resolved.precision is not Precision.FP16]
    if not kept:
        kept = _in_fp32(ctx.kernels, node, node_facts(node, opset, current), ctx.places, portable, fits)
        kept.sort(key=Candidate.sort_key)
    return kept or ranked


def _no_kernel_message(failures: dict, places: ValidPlaces) -> str:
    parts = []
    for op, entry in failures.items():
        names = ", ".join(entry["nodes"][:5]) + (f" and {len(entry['nodes']) - 5} more"
                                                  if len(entry["nodes"]) > 5 else "")
        why = "; ".join(entry["reasons"]) or "no kernel registered"
        parts.append(f"{op} (nodes {names}): {why}")
    return (f"no kernel found in the valid places ({places}) for: " + " | ".join(parts))


def _pick_body(body: Graph, parent: Pick, ctx: PassContext) -> None:
    """Body nodes run with their parent: the parent's target if it takes their values as they are."""
    target = parent.kernel.target
    places = parse_places(f"{target}/any/any,host/any/any", host_fallback=False)
    for node in body:
        opset = node_opset(ctx.model.opset, node)
        ranked, _ = candidates_for(ctx.kernels, node, opset, places, {}, True)
        exact = [c for c in ranked if _takes_as_is(c.scored, node)]
        if not exact:
            raise UnsupportedOpsError(f"no kernel in {target} or host runs {node.op_type} (node {node.name}) "
                                      f"inside the body of {parent.kernel.op}")
        pick = Pick(exact[0].scored.resolved)
        annotate(node, pick)
        for inner in node.subgraphs():
            _pick_body(inner, pick, ctx)


#: Precisions a body value has as it is (bodies run in the model's own types, never converted: fp32, or fp16
#: in an fp16 model; a value read from outside is brought back to its type by type_precision_cast).
_AS_IS = frozenset({Precision.ANY, Precision.FP32, Precision.FP16, Precision.INT64, Precision.INT32,
                    Precision.BOOL})


def _takes_as_is(item: Scored, node: Node) -> bool:
    """The kernel reads each of the node's inputs in its own type and layout (no calib or layout cast)."""
    resolved = item.resolved
    for port, value in zip(resolved.inputs, node.inputs):
        if value is None:
            continue
        own = precision_of_dtype(value.dtype) if value.dtype else Precision.ANY
        if port.precision not in _AS_IS or (own is not Precision.ANY and port.precision not in (Precision.ANY, own)):
            return False
        if port.layout not in (Layout.ANY, Layout.NCHW):
            return False
    return resolved.layout in (Layout.ANY, Layout.NCHW)

