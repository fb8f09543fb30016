"""static_kernel_pick: choose, for every node, the kernel of the valid places that scores best.

    Conv(x, w)            ->  Conv(x, w)   node.kernel = arm:Conv:1-21:fp16:nhwc, score 1784
    DQ -> Conv -> Q       ->  same nodes,  node.kernel = arm:QLinearConv:10-:int8:nchw (absorbed later)

Nodes are visited in execution order; each candidate is checked (opset, element types, attribute
constraints: a refusal is a sentence), resolved against the node's inputs as they will arrive (a picked
producer's output precision and layout), and graded with Paddle-Lite's score (worker.kernels.pick). The
trace keeps, for every node, its top candidates with their scores. A node with no applicable candidate
fails the run with the reasons each candidate gave. Nodes inside If/Loop/Scan bodies run with their parent
node: they get the best kernel of the parent's target that takes their values as they are, or the host's.
"""
from __future__ import annotations

from worker.errors import UnsupportedOpsError
from worker.ir import Graph, Node, Value
from worker.kernels import default_table
from worker.kernels.ops import nhwc_slots
from worker.kernels.pick import Scored, rank
from worker.passes.base import PassContext, PassKind, PassResult
from worker.passes.place import qdq
from worker.passes.place.casts import annotate, fits_fp16
from worker.passes.place.facts import Pick, is_constant, node_facts, node_opset
from worker.passes.place.functions import nhwc_form, nhwc_refusal
from worker.passes.registry import register_pass
from worker.places import Layout, Precision, ValidPlaces, parse_places

TOP = 3


def candidates_for(node: Node, opset: int, places: ValidPlaces, current, portable: bool = False,
                   fits: dict | None = None, ranks: dict | None = None
                   ) -> tuple[list[tuple[Scored, object]], list[str]]:
    """Applicable candidates best first (each with its Q/DQ sandwich or None) and the refusals.

    ``ranks`` remembers the ranking of each distinct (op, facts) within one pass: a model repeats the same
    few node signatures hundreds of times, and ranking depends on nothing else.
    """
    table = default_table()
    fits = {} if fits is None else fits
    facts = node_facts(node, opset, current)
    key = _rank_key(facts)
    if ranks is not None and key is not None and key in ranks:
        scored, refused = ranks[key]
    else:
        kernels = table.kernels(node.op_type, node.domain, opset=opset, targets=places.targets)
        scored, refused = rank(kernels, facts, places)
        if ranks is not None and key is not None:
            ranks[key] = scored, refused
    found = [(s, None) for s in scored]
    reasons = [reason for _, reason in refused]
    sandwich = qdq.find(node)
    if sandwich is not None:
        qkernels = table.kernels(sandwich.qop, "", opset=opset, targets=places.targets)
        qscored, qrefused = rank(qkernels, qdq.facts(sandwich, opset), places)
        found += [(s, sandwich) for s in qscored]
        reasons += [reason for _, reason in qrefused]
    kept = []
    for item, sandwich_of in found:
        reason = _form_refusal(item, node, opset, portable, fits)
        if reason:
            reasons.append(reason)
        else:
            kept.append((item, sandwich_of))
    # equal scores: the user's place order, then the float form before the quantized one, then table order
    kept.sort(key=lambda pair: (-pair[0].score, pair[0].place_index, pair[1] is not None, pair[0].order))
    return kept, reasons


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
        if (value is not None and slot < len(item.resolved.inputs) and item.resolved.inputs[slot][0] is Precision.FP16
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
        precision, layout, _ = pick.resolved.outputs[slot]
        if precision.value == "any":
            precision = current.get(value, (None, None))[0] or _own_precision(value)
        if layout.value == "any" or value.rank != 4:
            layout = Layout.NCHW
        current[value] = (precision, layout)


def _own_precision(value: Value):
    from worker.places import precision_of_dtype
    return precision_of_dtype(value.dtype)


def _trace(node: Node, ranked: list) -> dict:
    best = ranked[0][0]
    return {"node": node.name, "op": node.op_type if not node.domain else f"{node.domain}.{node.op_type}",
            "kernel": best.kernel.id, "place": str(Pick(best.resolved).place),
            "candidates": [{"kernel": s.kernel.id, "score": round(s.score, 3)} for s, _ in ranked[:TOP]]}


@register_pass(name="static_kernel_pick", kind=PassKind.STMT, level=1,
               description="pick each node's kernel by Paddle-Lite's score over the valid places "
                           "(target > precision > layout, place priority), ties by the user's order")
def static_kernel_pick(ctx: PassContext) -> PassResult:
    result = PassResult()
    current: dict[Value, tuple] = {}
    failures: dict[str, dict] = {}
    portable, fits, ranks = ctx.options.portable, {}, {}
    for node in ctx.graph:
        opset = node_opset(ctx.model.opset, node)
        ranked, reasons = candidates_for(node, opset, ctx.places, current, portable, fits, ranks)
        if not ranked:
            entry = failures.setdefault(node.op_type if not node.domain else f"{node.domain}.{node.op_type}",
                                        {"nodes": [], "reasons": reasons[:4]})
            entry["nodes"].append(node.name)
            continue
        best, sandwich = ranked[0]
        pick = Pick(best.resolved, sandwich)
        annotate(node, pick.kernel, pick.place, pick)
        _outputs_of(pick, node, current)
        result.details.append(_trace(node, ranked))
        for body in node.subgraphs():
            _pick_body(body, pick, ctx)
    if failures:
        raise UnsupportedOpsError(_no_kernel_message(failures, ctx.places))
    result.data["picked"] = len(result.details)
    return result


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
        ranked, _ = candidates_for(node, opset, places, {}, True)
        exact = [pair for pair in ranked if _takes_as_is(pair[0])]
        if not exact:
            raise UnsupportedOpsError(f"no kernel in {target} or host runs {node.op_type} (node {node.name}) "
                                      f"inside the body of {parent.kernel.op}")
        pick = Pick(exact[0][0].resolved)
        annotate(node, pick.kernel, pick.place, pick)
        for inner in node.subgraphs():
            _pick_body(inner, pick, ctx)


def _takes_as_is(item: Scored) -> bool:
    resolved = item.resolved
    return all(p.value in ("any", "fp32", "int64", "int32", "bool") and l in (Layout.ANY, Layout.NCHW)
               for p, l, _ in resolved.inputs) and resolved.layout in (Layout.ANY, Layout.NCHW)

