"""What the place passes read off the IR (node facts for kernel pick, attribute defaults, the fetch contract)
and what they record on it (a node's pick, in the node and in its metadata).

The feed/fetch contract: graph inputs arrive on the host in their own dtype and NCHW, and graph outputs
must leave the same way. ``variable_place_inference`` records each output's contract in the context
(``PassContext.fetch_places``, by output name, which casts at an output keep) before it changes a value's
dtype; the cast passes read it back.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from onnx import defs, helper

from worker.engine.ir import Node, Value
from worker.engine.kernels.pick import NodeFacts, Pick, Scored, ValueFacts, place_match, rank
from worker.engine.mirserve_domain import ops as domain
from worker.engine.passes.support.nhwc import TO_NCHW, TO_NHWC
from worker.engine.kernels.ops import nhwc_slots
from worker.engine.places import (HOST, Layout, Place, Precision, ValidPlaces, dtype_of_precision, get_target,
                                  precision_of_dtype)

if TYPE_CHECKING:
    from worker.engine.passes.base import PassContext

#: Node metadata written to the file: the kernel's id and the place it runs in.
KERNEL_KEY, PLACE_KEY = "mirserve.kernel", "mirserve.place"
#: The (precision, layout) a value will have once its producer runs on its picked kernel.
Current = Mapping[Value, "tuple[Precision, Layout]"]


def annotate(node: Node, pick: Pick) -> None:
    """Record a node's pick: on the node for later passes, in its metadata for the file."""
    node.pick = pick
    node.metadata[KERNEL_KEY] = pick.kernel.id
    node.metadata[PLACE_KEY] = str(pick.place)


def host_place(dtype: int) -> Place:
    return Place(HOST, precision_of_dtype(dtype), Layout.NCHW)


def set_fetch(ctx: "PassContext", value: Value, place: Place) -> None:
    ctx.fetch_places.setdefault(value.name, place)


def fetch_place(ctx: "PassContext", value: Value) -> Place:
    """The place a graph output must leave in: recorded, or host / its dtype / nchw."""
    return ctx.fetch_places.get(value.name) or host_place(value.dtype)


def is_constant(value: Value) -> bool:
    """Known offline: an initializer the user cannot feed, or a Constant node's output."""
    if value.is_constant:
        return True
    producer = value.producer
    return producer is not None and producer.op_type == "Constant" and producer.domain == ""


def value_facts(value: Value, current: Current | None = None) -> ValueFacts:
    if current is not None and value in current:
        precision, layout = current[value]
    elif value.place is not None:
        precision, layout = value.place.precision, value.place.layout
    else:
        precision, layout = precision_of_dtype(value.dtype), Layout.NCHW
    dtype = value.dtype
    if dtype in (1, 10) and precision in (Precision.FP32, Precision.FP16):  # as a producer's kernel makes it
        dtype = 1 if precision is Precision.FP32 else 10
    return ValueFacts(dtype=dtype, rank=value.rank, shape=value.shape, is_constant=is_constant(value),
                      precision=precision, layout=layout, is_tensor=value.type_proto is None,
                      numel=value.numel())


def node_facts(node: Node, opset: int, current: Current | None = None) -> NodeFacts:
    inputs = tuple(None if v is None else value_facts(v, current) for v in node.inputs)
    outputs = tuple(replace(value_facts(v, current), used=v.is_used) for v in node.outputs)
    attributes = dict(attribute_defaults(node.op_type, node.domain, opset))
    attributes.update({name: attr.value for name, attr in node.attributes.items()})
    return NodeFacts(node.op_type, node.domain, opset, inputs, outputs, attributes, node.name)


@functools.lru_cache(maxsize=None)
def attribute_defaults(op: str, op_domain: str, opset: int) -> Mapping[str, Any]:
    """Default values of an op's attributes at an opset (schema defaults; own-domain op defaults)."""
    if op_domain == domain.DOMAIN:
        own = domain.get_op(op)
        return {} if own is None else {k: v for k, v in own.attributes.items() if v is not None}
    try:
        schema = defs.get_schema(op, opset, op_domain)
    except Exception:  # an op onnx does not know (a custom domain): no defaults
        return {}
    found = {}
    for name, attr in schema.attributes.items():
        if attr.default_value is not None and attr.default_value.type:
            value = helper.get_attribute_value(attr.default_value)
            found[name] = value.decode() if isinstance(value, bytes) else value
    return found


def node_opset(model_opsets, node: Node) -> int:
    """The opset version a node is read at: its domain's import (own-domain ops are version 1)."""
    if node.domain == domain.DOMAIN:
        return domain.VERSION
    return model_opsets(node.domain)


# --- the places of a picked node's outputs ----------------------------------------------------------
FLOAT_DTYPES = (1, 10)  # float, float16: the element types a calib converts between


def _effective_shape(value: Value, layout: Layout):
    """The shape ``value`` will have where a consumer reads it in ``layout`` (after any layout cast)."""
    shape = value.shape
    if shape is None or layout is Layout.ANY:
        return shape
    current = value.place.layout if value.place is not None else Layout.NCHW
    if len(shape) < 4 and layout is Layout.NHWC and is_constant(value) and (value.numel() or 0) > 1:
        shape = (1,) * (4 - len(shape)) + tuple(shape)  # a constant lifted to rank 4
        current = Layout.NCHW
    if len(shape) != 4 or current is layout:
        return shape
    return tuple(shape[i] for i in (TO_NHWC if layout is Layout.NHWC else TO_NCHW))


def _broadcast(shapes) -> tuple | None:
    """Numpy broadcasting over shapes whose dims may be symbolic (str) or unknown (None)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        known = [d for d in dims if d != 1]
        result.append(known[0] if known else 1)
    return tuple(result)


def _output_shape(node: Node, pick: Pick, value: Value, layout: Layout):
    """NHWC outputs: a wrapped layout-sensitive node's NCHW result permuted; an elementwise node's the
    broadcast of its inputs as they will arrive; anything else as type inference gave it."""
    if layout is not Layout.NHWC or value.shape is None or len(value.shape) != 4:
        return value.shape
    if pick.kernel.layout is Layout.NHWC:
        wrapped = (node.op_type, node.domain) == (pick.kernel.op, pick.kernel.domain) and \
            nhwc_slots(node.op_type, node.domain) is not None
        return tuple(value.shape[i] for i in TO_NHWC) if wrapped else value.shape
    shapes = [_effective_shape(v, layout) for v in node.inputs if v is not None]
    merged = _broadcast(shapes)
    return merged if merged is not None and len(merged) == 4 else value.shape


def place_outputs(node: Node, pick: Pick) -> None:
    """Give a picked node's outputs the places its kernel declares (dtype and NHWC shape follow)."""
    for slot, value in enumerate(node.outputs):
        port = pick.output(slot)
        precision, layout = port.precision, port.layout
        if precision is Precision.ANY or value.dtype not in FLOAT_DTYPES or precision not in (
                Precision.FP32, Precision.FP16):
            precision = precision if precision is not Precision.ANY else precision_of_dtype(value.dtype)
        else:
            value.dtype = dtype_of_precision(precision)
        if layout is Layout.ANY or value.rank != 4:
            layout = Layout.NCHW
        if value.place is None or value.place.layout is not layout:
            value.shape = _output_shape(node, pick, value, layout)
        value.place = Place(get_target(port.target), precision, layout)


# --- what a rewrite may not lose: the best place a node can get ---------------------------------------
def place_score(scored: "Scored", places) -> float:
    """The place part of Paddle-Lite's grade: the best weighted (target, precision, layout) match of the
    kernel over the valid places, leaving out the input-compatibility terms (they follow picks not made yet).
    The kernel of an op with no NHWC form reads plain tensors in any layout (as ``first_place`` has it), so
    its layout always matches: a MatMul chain is no worse off in an NHWC place than its elementwise ops."""
    kernel = scored.kernel
    if nhwc_slots(kernel.op, kernel.domain) is None and kernel.layout is not Layout.ANY:
        kernel = replace(kernel, layout=Layout.ANY)
    return max(place_match(kernel, place) * places.weight(place) for place in places)


def best_place(ctx: "PassContext", facts: NodeFacts, places: "ValidPlaces | None" = None) \
        -> "tuple[float, str] | None":
    """The best place score a node with these facts can get from this run's kernels (among ``places``, by
    default the run's), and that place; None when no kernel of a valid place applies (or no tables are
    loaded)."""
    if ctx.kernels is None:
        return None
    places = places or ctx.places
    candidates = ctx.kernels.kernels(facts.op, facts.domain, opset=facts.opset, targets=places.targets)
    scored, _ = rank(candidates, facts, places)
    best = None
    for item in scored:
        score = place_score(item, places)
        if best is None or score > best[0]:
            resolved = item.resolved
            best = (score, f"{item.kernel.target}/{resolved.precision.value}/{resolved.layout.value}")
    return best


def placement_refusal(ctx: "PassContext", new: NodeFacts, replaced: "list[Node]") -> str | None:
    """Why a rewrite into a node with the facts ``new`` would lose placement (a sentence), or None.

    The rewrite is allowed only where the new node can get a place at least as good (Paddle-Lite's place
    score) as the best any node it replaces would get: a node is never moved to a worse place by a rewrite.
    """
    if ctx.kernels is None:
        return None
    mine = best_place(ctx, new)
    kept = _best_replaced(ctx, replaced)  # what the rewrite must keep
    if kept is None:
        return None
    node, (score, place) = kept
    qualified = f"{new.domain}.{new.op}" if new.domain else new.op
    if mine is None:
        return (f"no kernel of a valid place runs {qualified} here, while {node.op_type} {node.name} runs on "
                f"{place}: the rewrite would lose its placement")
    if mine[0] < score:
        return (f"{qualified} would run on {mine[1]} at best, while {node.op_type} {node.name} runs on "
                f"{place}: the rewrite would lose placement")
    return _fp32_refusal(ctx, new, replaced, qualified)


def fp32_places(places: ValidPlaces) -> ValidPlaces | None:
    """The places a node goes to when its half precision fails (auto mixed precision pins it to fp32): the
    fp32 ones; None when no place is fp16."""
    if not any(p.precision is Precision.FP16 for p in places):
        return None
    kept = tuple(p for p in places if p.precision in (Precision.FP32, Precision.ANY))
    return ValidPlaces(kept, sum(1 for p in kept if places.index(p) < places.user_count)) if kept else None


def _fp32_refusal(ctx: "PassContext", new: NodeFacts, replaced: "list[Node]", qualified: str) -> str | None:
    """placement_refusal's test again among the fp32 places, where a node whose fp16 result fails goes: a fused
    op that only the fp16 place runs must not send such a node to the host where its chain had an fp32 place
    (ARM runs mirserve.ScaledDotProductAttention, not MultiHeadAttention, whose Reshapes it leaves to the
    host)."""
    places = fp32_places(ctx.places)
    kept = _best_replaced(ctx, replaced, places) if places is not None else None
    if kept is None:
        return None
    mine = best_place(ctx, new, places)
    node, (score, place) = kept
    if mine is None or mine[0] < score:
        at_best = f"on {mine[1]} at best" if mine is not None else "nowhere"
        return (f"in fp32, where a node goes whose fp16 result fails, {qualified} would run {at_best}, while "
                f"{node.op_type} {node.name} runs on {place}: the rewrite would lose placement")
    return None


def placement_gain(ctx: "PassContext", new: NodeFacts, replaced: "list[Node]") -> str | None:
    """Why a rewrite into ``new`` would gain no placement (a sentence), or None when the new node gets a
    strictly better place than any node it replaces. For a rewrite that adds nodes and is worth it only for
    the place (the inverse of another rewrite that simplifies): placement_refusal's non-strict test on one
    side and this strict one on the other can never both allow, so the two cannot undo each other."""
    if ctx.kernels is None:
        return "no kernel tables to place it with"
    mine = best_place(ctx, new)
    kept = _best_replaced(ctx, replaced)
    qualified = f"{new.domain}.{new.op}" if new.domain else new.op
    if mine is None:
        return f"no kernel of a valid place runs {qualified} here"
    if kept is not None and mine[0] <= kept[1][0]:
        return f"{qualified} would run on {mine[1]} at best, no better than {kept[1][1]}: nothing to gain"
    return None


def _best_replaced(ctx: "PassContext", replaced: "list[Node]", places: "ValidPlaces | None" = None) \
        -> "tuple[Node, tuple[float, str]] | None":
    """The replaced node whose best place scores highest, with that place; None when none has a place."""
    found = None
    for node in replaced:
        theirs = best_place(ctx, node_facts(node, node_opset(ctx.opset, node)), places)
        if theirs is not None and (found is None or theirs[0] > found[1][0]):
            found = (node, theirs)
    return found


def planned_facts(op: str, op_domain: str, opset: int, inputs, outputs, attributes: Mapping[str, Any],
                  name: str = "") -> NodeFacts:
    """The facts of a node a rewrite would make: its inputs and outputs are existing values, ValueFacts for
    values it would add (a zero bias), or None; attributes over the op's defaults."""
    def facts(item):
        return item if item is None or isinstance(item, ValueFacts) else value_facts(item)

    merged = dict(attribute_defaults(op, op_domain, opset))
    merged.update(attributes)
    return NodeFacts(op, op_domain, opset, tuple(facts(v) for v in inputs), tuple(facts(v) for v in outputs),
                     merged, name)


def constant_facts(dtype: int, shape: tuple, *, constant: bool = True) -> ValueFacts:
    """The facts of a value a rewrite would add: a constant (a zero bias of ``shape``), or with
    ``constant=False`` an intermediate (a Flatten's output)."""
    numel = 1
    for dim in shape:
        numel = numel * dim if isinstance(dim, int) and isinstance(numel, int) else None
    return ValueFacts(dtype=dtype, rank=len(shape), shape=tuple(shape), is_constant=constant,
                      precision=precision_of_dtype(dtype), numel=numel)
