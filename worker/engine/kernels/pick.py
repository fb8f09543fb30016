"""Kernel pick for one node: which candidates apply, what each declares once resolved, and how each scores.

Pure functions over ``NodeFacts`` (what the pass knows about a node: dtypes, ranks, constants, attributes,
current precisions of its inputs), so the rules are testable without a graph.

Scoring is Paddle-Lite's static_kernel_pick grade. For each valid place i of N (weight (N - i) / N) a
candidate earns 255 if its target matches, 127 if its precision does (or is ``any``), 63 if its layout does
(or is ``any``); its score is the best weighted sum over the places. Then +1 for each input whose current
precision is compatible with the declared one, x2 when all are, and x2 when every non-constant input is a
plain tensor (Paddle-Lite's tensor-kind check). The top score wins. Paddle-Lite breaks ties by its kernel
registry order: it creates the candidates by walking a std::set of places ordered by the target, precision
and layout enums, and a stable sort keeps that order among equal scores. Here the walk follows the user's
order instead: among equal scores, the candidate whose place the user listed first wins, then table order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from onnx import TensorProto

from worker.engine.kernels.ops import nhwc_slots
from worker.engine.kernels.schema import ANY, EACH, SAME, Kernel, PortSpec
from worker.engine.places import Layout, Place, Precision, ValidPlaces, get_target

TARGET_SCORE, PRECISION_SCORE, LAYOUT_SCORE = 255, 127, 63
CAST_OPS = ("io_copy", "calib", "layout")

FLOATS = frozenset({Precision.FP32, Precision.FP16})

#: ONNX element type number -> name as the kernel tables spell it ("float", "float8e4m3fn", "int4", ...), for
#: ``types`` checks of precision ``any`` kernels: every type onnx knows, so a new one is never a bare number.
_ELEMENT_NAMES = {number: name.lower() for name, number in TensorProto.DataType.items() if number}


@dataclass(frozen=True)
class ValueFacts:
    """What kernel pick needs to know about one input or output value."""

    dtype: int = 0                      # onnx element type; 0 when unknown
    rank: int | None = None
    shape: tuple | None = None
    is_constant: bool = False           # known offline (initializer or Constant): converted in the file
    precision: Precision = Precision.ANY  # its current precision (a producer's kernel may have changed it)
    layout: Layout = Layout.NCHW        # its current layout
    is_tensor: bool = True
    numel: int | None = None
    used: bool = True                   # for outputs: read by some node or a graph output

    @property
    def element(self) -> str | None:
        return _ELEMENT_NAMES.get(self.dtype)


@dataclass(frozen=True)
class NodeFacts:
    op: str
    domain: str
    opset: int
    inputs: tuple[ValueFacts | None, ...]
    outputs: tuple[ValueFacts | None, ...]
    attributes: Mapping[str, Any] = field(default_factory=dict)  # with schema defaults filled in
    name: str = ""


@dataclass(frozen=True)
class Port:
    """What a kernel, resolved against a node, declares for one input or output: the target whose memory it
    reads or writes, its precision and its layout (``any``: whatever arrives, nothing is converted)."""

    target: str
    precision: Precision
    layout: Layout

    def __str__(self) -> str:
        return f"{self.target}/{self.precision.value}/{self.layout.value}"


@dataclass(frozen=True)
class Resolved:
    """A candidate kernel with its ``same`` and ``any`` resolved against one node."""

    kernel: Kernel
    precision: Precision
    layout: Layout
    inputs: tuple[Port, ...]     # per node input slot
    outputs: tuple[Port, ...]    # per node output slot


@dataclass(frozen=True)
class Pick:
    """What kernel pick leaves on a placed node (``Node.pick``), casts included: the kernel, resolved.

    ``qdq`` is set when the node runs in its quantized form (a Conv between DequantizeLinear and
    QuantizeLinear on a QLinearConv kernel): type_precision_cast absorbs that Q/DQ sandwich into it, and the
    node it makes has ``absorbed`` set (it computes in int8 what the input model computed in float).
    """

    resolved: Resolved
    qdq: Any = None
    absorbed: bool = False

    @property
    def kernel(self) -> Kernel:
        return self.resolved.kernel

    @property
    def place(self) -> Place:
        return Place(get_target(self.kernel.target), self.resolved.precision, self.resolved.layout)

    def input(self, slot: int) -> Port:
        return self.resolved.inputs[slot]

    def output(self, slot: int) -> Port:
        return self.resolved.outputs[slot]


@dataclass(frozen=True)
class Scored:
    resolved: Resolved
    score: float
    place_index: int                # the first valid place the kernel fits: the user-order tie-break
    order: int                      # position in the table, the last tie-break

    @property
    def kernel(self) -> Kernel:
        return self.resolved.kernel

    def sort_key(self):
        return (-self.score, self.place_index, self.order)


# --- applicability ----------------------------------------------------------------------------------------
def first_place(kernel: Kernel, places: ValidPlaces) -> int | None:
    """Index of the first valid place the kernel runs in, None when it fits none.

    A kernel is a candidate only in a place the user allows (Paddle-Lite creates kernels per valid place,
    widened to precision and layout ``any``). A place's precision chooses how floats are computed; kernels
    of integer, boolean or int8 data (shape arithmetic, masks, quantize / dequantize) fit any place of
    their target, and lose to a float kernel of the place's precision on score. A place's layout chooses
    between the NCHW and NHWC kernels of layout-sensitive ops (convolutions, pools); the kernels of ops that
    have no NHWC form (MatMul, Softmax, Reshape) read plain tensors and fit any layout.
    """
    plain = nhwc_slots(kernel.op, kernel.domain) is None
    cast = kernel.domain == "mirserve" and kernel.op in CAST_OPS  # a cast converts between places
    for index, place in enumerate(places):
        if (kernel.target == place.target.name
                and (kernel.precision is place.precision or kernel.precision not in FLOATS or cast
                     or place.precision is Precision.ANY)
                and (kernel.layout is place.layout or Layout.ANY in (kernel.layout, place.layout) or plain)):
            return index
    return None


def refusal(kernel: Kernel, node: NodeFacts) -> str | None:
    """Why ``kernel`` cannot run ``node`` (a sentence), or None when it can."""
    for check in (_arity_refusal, _dtype_refusal, _constraint_refusal):
        reason = check(kernel, node)
        if reason:
            return reason
    return None


def _arity_refusal(kernel: Kernel, node: NodeFacts) -> str | None:
    for slot, value in enumerate(node.inputs):
        if value is not None and kernel.input_port(slot) is None:
            return f"{kernel.id} declares {len(kernel.inputs)} inputs, the node has {len(node.inputs)}"
    return None


def _dtype_refusal(kernel: Kernel, node: NodeFacts) -> str | None:
    for label, values, port_of in (("input", node.inputs, kernel.input_port),
                                   ("output", node.outputs, kernel.output_port)):
        for slot, value in enumerate(values):
            port = port_of(slot)
            if value is None or port is None or not value.dtype or not value.used:
                continue
            if not _accepts(kernel, port, value):
                return (f"{kernel.id} does not take {value.element or value.dtype} at {label} {slot} "
                        f"({port.name})")
    return None


_OTHER_FLOAT = {"float": "float16", "float16": "float"}


def _free_port_type(port: PortSpec, value: ValueFacts) -> Precision:
    """What a precision ``any`` port with listed types wants of ``value``: ANY (as it is) or a float."""
    if port.types is None or value.element in port.types:
        return Precision.ANY
    other = _OTHER_FLOAT.get(value.element or "")
    if other in port.types:
        return Precision.FP32 if other == "float" else Precision.FP16
    return Precision.ANY


def _accepts(kernel: Kernel, port: PortSpec, value: ValueFacts) -> bool:
    declared = kernel.precision.value if port.precision == SAME else port.precision
    if declared in (ANY, EACH):
        if port.precision != SAME:
            return (port.types is None or value.element in port.types
                    or _OTHER_FLOAT.get(value.element or "") in port.types)
        return (kernel.types is None or value.element in kernel.types
                or _OTHER_FLOAT.get(value.element or "") in kernel.types)
    precision = Precision(declared)
    if precision in FLOATS:
        return value.dtype in (1, 10)        # float or float16: a calib converts between them
    if precision is Precision.INT8:
        return value.dtype in (2, 3)         # uint8 or int8
    return value.element == {"int32": "int32", "int64": "int64", "bool": "bool"}[precision.value]


def _constraint_refusal(kernel: Kernel, node: NodeFacts) -> str | None:
    constraints = kernel.constraints
    first = node.inputs[0] if node.inputs else None
    if "rank" in constraints and first is not None and first.rank not in constraints["rank"]:
        return f"{kernel.id} needs input rank in {list(constraints['rank'])}, got {first.rank}"
    for slot in constraints.get("constant_inputs", ()):
        value = node.inputs[slot] if slot < len(node.inputs) else None
        if value is not None and not value.is_constant:
            return f"{kernel.id} needs input {slot} to be a constant (weights known offline)"
    for name, allowed in constraints.get("attributes", {}).items():
        value = node.attributes.get(name)
        if isinstance(value, bytes):
            value = value.decode()
        if isinstance(value, list):
            value = tuple(value)
        if value not in allowed:
            return f"{kernel.id} needs attribute {name} in {list(allowed)}, got {value!r}"
    if "max_outputs" in constraints:
        produced = max((i + 1 for i, v in enumerate(node.outputs) if v is not None and v.used), default=0)
        if produced > constraints["max_outputs"]:
            return f"{kernel.id} produces at most {constraints['max_outputs']} output(s), the node uses {produced}"
    if "group" in constraints:
        kind = group_kind(node)
        if kind is not None and kind not in constraints["group"]:
            return f"{kernel.id} runs {'/'.join(constraints['group'])} convolutions, not {kind} ones"
    if "kernel_shape" in constraints:
        shape = node.attributes.get("kernel_shape")
        if shape and (len(set(shape)) != 1 or shape[0] not in constraints["kernel_shape"]):
            return f"{kernel.id} runs square kernels of size {list(constraints['kernel_shape'])}, not {list(shape)}"
    return None


def group_kind(node: NodeFacts) -> str | None:
    """'one', 'depthwise' or 'grouped' for a convolution whose weight shape is known."""
    group = node.attributes.get("group", 1)
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if group == 1:
        return "one"
    if weight is None or weight.shape is None or len(weight.shape) < 2:
        return None
    return "depthwise" if weight.shape[1] == 1 else "grouped"


# --- resolution -----------------------------------------------------------------------------------------
def resolve(kernel: Kernel, node: NodeFacts) -> Resolved:
    """Fix the kernel's ``any`` precision and layout from the node's inputs, then every port's type."""
    precision = kernel.precision if kernel.precision is not Precision.ANY else _resolve_precision(kernel, node)
    layout = kernel.layout if kernel.layout is not Layout.ANY else _resolve_layout(kernel, node)

    def port_type(spec: PortSpec | None, value: ValueFacts | None) -> Port:
        if spec is None:
            return Port(kernel.target, Precision.ANY, Layout.ANY)
        if spec.precision == EACH:  # the value's own precision, as the node's facts give it
            return Port(spec.target or kernel.target, value.precision if value is not None else Precision.ANY,
                        layout if spec.layout == SAME else Layout(spec.layout))
        p = precision if spec.precision == SAME else Precision(spec.precision)
        if p is Precision.ANY and spec.precision != SAME and value is not None:
            p = _free_port_type(spec, value)
        l = layout if spec.layout == SAME else Layout(spec.layout)
        return Port(spec.target or kernel.target, p, l)

    inputs = tuple(port_type(kernel.input_port(i), v) for i, v in enumerate(node.inputs))
    outputs = tuple(port_type(kernel.output_port(i), v) for i, v in enumerate(node.outputs))
    return Resolved(kernel, precision, layout, inputs, outputs)


def _bound_inputs(kernel: Kernel, node: NodeFacts, attr: str) -> list[ValueFacts]:
    found = []
    for slot, value in enumerate(node.inputs):
        port = kernel.input_port(slot)
        if value is not None and port is not None and getattr(port, attr) == SAME:
            found.append(value)
    return found


def _resolve_precision(kernel: Kernel, node: NodeFacts) -> Precision:
    bound = _bound_inputs(kernel, node, "precision")
    live = [v for v in bound if not v.is_constant] or bound
    if live:
        precision = live[0].precision
        element = {Precision.FP32: "float", Precision.FP16: "float16"}.get(precision)
        if kernel.types is not None and element is not None and element not in kernel.types:
            other = _OTHER_FLOAT[element]  # a float kernel of the other width: a calib converts
            if other in kernel.types:
                return Precision.FP32 if other == "float" else Precision.FP16
        return precision
    outputs = [v for v in node.outputs if v is not None]
    return outputs[0].precision if outputs else Precision.ANY


def _resolve_layout(kernel: Kernel, node: NodeFacts) -> Layout:
    live = [v for v in _bound_inputs(kernel, node, "layout") if not v.is_constant]
    if not live or not all(v.rank == 4 or v.numel == 1 for v in live):
        return Layout.NCHW
    first = next((v for v in live if v.rank == 4), None)
    return first.layout if first is not None else Layout.NCHW


# --- scoring --------------------------------------------------------------------------------------------
def place_match(kernel: Kernel, place: Place) -> int:
    score = 0
    if kernel.target == place.target.name:
        score += TARGET_SCORE
    if kernel.precision in (place.precision, Precision.ANY) or place.precision is Precision.ANY:
        score += PRECISION_SCORE
    if kernel.layout in (place.layout, Layout.ANY) or place.layout is Layout.ANY:
        score += LAYOUT_SCORE
    return score


def compatible(current: Precision, declared: Precision) -> bool:
    """Paddle-Lite's PrecTypeCompatible: equal, ``any``, or fp32 and fp16 (a calib converts them cheaply)."""
    return (current is declared or Precision.ANY in (current, declared)
            or (current in FLOATS and declared in FLOATS))


def grade(resolved: Resolved, node: NodeFacts, places: ValidPlaces, order: int = 0) -> Scored:
    kernel = resolved.kernel
    score = max(place_match(kernel, place) * places.weight(place) for place in places)
    live = [(value, port) for value, port in zip(node.inputs, resolved.inputs) if value is not None]
    compat = sum(1 for value, port in live if value.is_constant or compatible(value.precision, port.precision))
    score += compat
    if live and compat == len(live):
        score *= 2
    if all(value.is_tensor for value, _ in live if not value.is_constant):
        score *= 2
    index = first_place(kernel, places)
    return Scored(resolved, score, len(places) if index is None else index, order)


def rank(candidates: Sequence[Kernel], node: NodeFacts, places: ValidPlaces
         ) -> tuple[list[Scored], list[tuple[Kernel, str]]]:
    """Applicable candidates best first, and the refused ones with the reason."""
    scored, refused = [], []
    for order, kernel in enumerate(candidates):
        if first_place(kernel, places) is None:
            refused.append((kernel, f"{kernel.id} runs in {kernel.place_text}, which no valid place allows"))
            continue
        reason = refusal(kernel, node)
        if reason:
            refused.append((kernel, reason))
            continue
        resolved = resolve(kernel, node)
        scored.append(grade(resolved, node, places, order))
    scored.sort(key=Scored.sort_key)
    return scored, refused
