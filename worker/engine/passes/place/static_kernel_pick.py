"""static_kernel_pick: choose every node's kernel for the least total cost of compute and casts.

    Conv(x, w)            ->  Conv(x, w)   node.pick: arm:Conv:1-21:fp16:nhwc
    DQ -> Conv -> Q       ->  same nodes,  node.pick: arm:QLinearConv:10-:int8:nchw (absorbed later)

Each node's candidates are checked (opset, element types, attribute constraints: a refusal is a sentence)
and resolved against its inputs as they may arrive. Paddle-Lite's pick (worker.engine.kernels.pick) walks the
nodes in execution order and takes the best-scored candidate given its producers' picks: that is the greedy
pick, the starting point and the yardstick. The plan (worker.engine.passes.support.pick_plan) then weighs
every candidate's compute cost (the cost model, worker/engine/kernels/data/costs.toml) with the casts its
choice forces on its edges, and keeps the cheapest choice it finds that casts no more than the greedy pick;
the report's ``placement`` section gives its cost, the greedy cost and a lower bound. Whether a Q/DQ sandwich
runs as one int8 kernel stays the greedy pick's call (the user's place order): it changes what is computed.
The trace keeps, for every node, its pick and its cheapest other options. A node with no applicable candidate
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
from worker.engine.kernels.cost import default_cost_model
from worker.engine.kernels.ops import nhwc_slots
from worker.engine.kernels.pick import NodeFacts, Pick, Scored, ValueFacts, rank, refusal
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support import qdq
from worker.engine.passes.support.casts import fits_fp16, is_cast, same_memory
from worker.engine.passes.support.nhwc import nhwc_form, nhwc_refusal
from worker.engine.passes.support import pick_plan as plan, pick_search as search
from worker.engine.passes.support.placement import annotate, fetch_place, is_constant, node_facts, node_opset
from worker.engine.places import (HOST, REDUCED_PRECISIONS, Layout, Precision, ValidPlaces, get_target, parse_places,
                                  precision_of_dtype)

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
    facts = node_facts(node, opset, current)
    if node.subgraphs():
        facts = _as_the_body_takes(node, facts)
    return ranked_for(table, node, facts, places, portable, fits, ranks)


def ranked_for(table: KernelTable, node: Node, facts: NodeFacts, places: ValidPlaces, portable: bool = False,
               fits: dict | None = None, ranks: dict | None = None) -> tuple[list[Candidate], list[str]]:
    """``candidates_for`` with the node's facts given (its inputs as they would arrive)."""
    fits = {} if fits is None else fits
    opset = facts.opset
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
    if not kept and any(c.scored.resolved.precision is Precision.FP16 for c in found):
        # every kernel followed the node's fp16 inputs into fp16, where it may not compute (a constant beyond
        # fp16's range, as an attention mask's finfo(float32).min; int8-quantized data): in fp32 after a calib
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
    any precision follows its inputs into fp16, which a node may not compute in (next to int8-quantized data,
    or reading a constant beyond fp16's range)."""
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


def _trace(node: Node, options: list, chosen: int) -> dict:
    """The node's pick and its cheapest other options (cost units of the cost model; Paddle-Lite's score)."""
    best = options[chosen]
    others = sorted((o for i, o in enumerate(options) if i != chosen), key=lambda o: o.cost)
    return {"node": node.name, "op": node.op_type if not node.domain else f"{node.domain}.{node.op_type}",
            "kernel": best.candidate.scored.kernel.id, "place": str(best.candidate.pick.place),
            "candidates": [{"kernel": o.candidate.scored.kernel.id, "place": str(o.candidate.pick.place),
                            "cost": round(o.compute, 1), "score": round(o.candidate.scored.score, 3)}
                           for o in [best, *others][:TOP]]}


@register_pass(name="static_kernel_pick", peer="Paddle-Lite", kind=PassKind.STMT, level=1,
               description="pick every node's kernel for the least total cost of compute and casts (a cost "
                           "model per target and precision), from Paddle-Lite's greedy pick; ties by the "
                           "user's place order")
def static_kernel_pick(ctx: PassContext) -> PassResult:
    result = PassResult()
    nodes, options, failures = _options(ctx)
    if failures:
        ctx.report["pick_failures"] = failures  # --check-support reports them per op type and stops here
        if not ctx.options.check_support_only:
            raise UnsupportedOpsError(_no_kernel_message(failures, ctx.places))
    flows = plan.build_flows(ctx.graph, nodes, lambda value: fetch_place(ctx, value), options)
    problem = plan.Problem(nodes, options, flows, default_cost_model())
    choice, figures = search.solve(problem, [0] * len(nodes))
    for node, node_options, chosen in zip(nodes, options, choice):
        pick = node_options[chosen].candidate.pick
        annotate(node, pick)
        result.details.append(_trace(node, node_options, chosen))
        for body in node.subgraphs():
            _pick_body(body, pick, ctx)
    result.data["picked"] = len(result.details)
    result.data["plan"] = ctx.report["placement"] = {**figures.to_dict(), "host_by_choice": _host_by_choice(
        ctx, nodes, options, choice)}
    return result


def _host_by_choice(ctx: PassContext, nodes: list[Node], options: list[list], choice: list[int]) -> dict:
    """Op types of the nodes the plan put on a host place although a place the user listed could run them
    (the casts around that place cost more), with their node counts."""
    users = {p.target.name for p in ctx.places if p.target.name != HOST.name}
    found: dict[str, int] = {}
    for node, node_options, chosen in zip(nodes, options, choice):
        if node_options[chosen].place[0] == HOST.name and any(o.place[0] in users for o in node_options):
            op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            found[op] = found.get(op, 0) + 1
    return dict(sorted(found.items()))


def _options(ctx: PassContext) -> tuple[list[Node], list[list], dict]:
    """Every node's options, greedy pick first: Paddle-Lite's pick walks the graph in execution order with
    each input as its producer's pick leaves it; the other options take the inputs in every other state."""
    current: dict[Value, tuple] = {}
    failures: dict[str, dict] = {}
    nodes, options = [], []
    portable = ctx.options.portable
    # pure functions of node facts (with this table and these places) and of weights: kept for the next build
    memo = ctx.memo.setdefault("static_kernel_pick", {})
    fits, ranks, variants_memo = (memo.setdefault((id(ctx.kernels), str(ctx.places), portable, kind), {})
                                  for kind in ("fits", "ranks", "variants"))
    model = default_cost_model()
    for node in ctx.graph:
        facts = node_facts(node, node_opset(ctx.model.opset, node), current)
        if node.subgraphs():
            facts = _as_the_body_takes(node, facts)
        ranked, reasons = ranked_for(ctx.kernels, node, facts, ctx.places, portable, fits, ranks)
        if not ranked:
            entry = failures.setdefault(node.op_type if not node.domain else f"{node.domain}.{node.op_type}",
                                        {"nodes": [], "reasons": reasons[:4]})
            entry["nodes"].append(node.name)
            continue
        variants = [ranked[:1] if is_cast(node) else ranked]
        # A node with a body keeps its inputs' types (bodies are never converted); a cast of a model placed
        # before converts as its attributes say, whatever its kernel's name would claim.
        if not node.subgraphs() and not is_cast(node):
            variants += [ranked_for(ctx.kernels, node, v, ctx.places, portable, fits, ranks)[0]
                         for v in plan.input_variants(facts, ctx.places, variants_memo)]
        if node.name in ctx.pinned_fp32:
            variants = _pinned(variants, ctx, node, facts, portable, fits)
        _outputs_of(variants[0][0].pick, node, current)
        nodes.append(node)
        options.append(plan.build_options(node, variants, ctx.places, model))
    return nodes, options, failures


def _pinned(variants: list[list[Candidate]], ctx: PassContext, node: Node, facts: NodeFacts, portable: bool,
            fits: dict) -> list[list[Candidate]]:
    """A pinned node's candidates that compute neither in fp16 nor in int8 (``ctx.pinned_fp32``: auto mixed
    precision; a Conv between Q/DQ then keeps its sandwich on a float kernel), its fp16 inputs taken in fp32
    when its kernels follow their inputs' precision; its own candidates when it has no other (it cannot be
    pinned)."""
    kept = [k for k in ([c for c in v if c.scored.resolved.precision not in REDUCED_PRECISIONS] for v in variants)
            if k]
    if not kept:
        kept = [sorted(_in_fp32(ctx.kernels, node, facts, ctx.places, portable, fits), key=Candidate.sort_key)]
    return kept if kept[0] else variants


def _no_kernel_message(failures: dict, places: ValidPlaces) -> str:
    parts = []
    for op, entry in failures.items():
        names = ", ".join(entry["nodes"][:5]) + (f" and {len(entry['nodes']) - 5} more"
                                                  if len(entry["nodes"]) > 5 else "")
        why = "; ".join(entry["reasons"]) or "no kernel registered"
        parts.append(f"{op} (nodes {names}): {why}")
    return (f"no kernel found in the valid places ({places}) for: " + " | ".join(parts))


def _pick_body(body: Graph, parent: Pick, ctx: PassContext) -> None:
    """Body nodes run with their parent: the parent's target if it takes their values as they are. A parent on
    the host (a target without that control-flow op: Paddle-Lite runs its while and conditional_block on the
    host too) lends its body the user's targets that share host memory, in the user's order, as Paddle-Lite
    picks a sub-block's ops: a Silero VAD's convolutions under arm places run on ARM, not on the host."""
    targets = [parent.kernel.target]
    if parent.kernel.target == HOST.name:
        targets = [p.target.name for p in list(ctx.places)[:ctx.places.user_count]
                   if same_memory(p.target.name, HOST.name)] + targets
    places = parse_places(",".join(f"{t}/any/any" for t in dict.fromkeys([*targets, HOST.name])),
                          host_fallback=False)
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

