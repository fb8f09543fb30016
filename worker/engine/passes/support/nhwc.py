"""NHWC forms: the own-domain ops that layout-sensitive nodes on NHWC kernels become.

A node on an NHWC kernel reads and writes NHWC tensors, which no standard layout-sensitive op does, so it
becomes ``mirserve.Nhwc<Op>``: the same op and attributes, whose body transposes the NHWC
inputs (data, and the weights the file stores in NHWC order) to NCHW, runs the op, and transposes the
result back. A runtime with an NHWC kernel runs it as one op; onnxruntime and onnx.reference run the body.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from onnx import NodeProto, defs, helper

from worker.engine.mirserve_domain import ops as domain
from worker.engine.kernels.ops import NHWC_ARITY, NHWC_PREFIX, nhwc_slots

TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
#: Attributes without a default that the NHWC form can still declare, because wrapping fills them in.
COMPLETED = ("kernel_shape", "strides", "dilations", "pads", "output_padding")
ARITY = NHWC_ARITY
BIASED = ("Conv", "ConvTranspose", "FusedConv", "FusedConvTranspose")


def is_biased(op: str) -> bool:
    return any(op == base or (op.startswith(base) and base.startswith("Fused")) for base in BIASED)


@dataclass(frozen=True)
class NhwcForm:
    """How one op becomes its NHWC form at one opset: declared attributes and the ones it cannot carry."""

    op: str
    op_domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict[str, Any]           # name -> default (None: the node always carries it)
    attribute_types: dict[str, int]
    slots: tuple[tuple[int, ...], tuple[int, ...]]

    @property
    def name(self) -> str:
        return NHWC_PREFIX + self.op


@functools.lru_cache(maxsize=None)
def nhwc_form(op: str, op_domain: str, opset: int) -> NhwcForm | None:
    """The NHWC form of an op, or None when the op has none (or its own-domain definition is missing)."""
    slots = nhwc_slots(op, op_domain)
    if slots is None:
        return None
    if op_domain == domain.DOMAIN:
        inner = domain.get_op(op)
        if inner is None:
            return None
        return NhwcForm(op, op_domain, inner.inputs[:ARITY.get(op, 3 if is_biased(op) else len(inner.inputs))],
                        inner.outputs[:max(slots[1]) + 1], dict(inner.attributes), {}, slots)
    schema = defs.get_schema(op, opset, op_domain)
    attributes, types = {}, {}
    for name, attr in schema.attributes.items():
        default = helper.get_attribute_value(attr.default_value) if attr.default_value.type else None
        if isinstance(default, bytes):
            default = default.decode()
        if default is None and name not in COMPLETED:
            continue
        if isinstance(default, list) and not default:
            continue
        attributes[name], types[name] = default, int(attr.type)
    required = sum(1 for p in schema.inputs if not str(p.option).endswith("Optional"))
    inputs = tuple(p.name for p in schema.inputs)[:ARITY.get(op, required)]
    outputs = tuple(p.name for p in schema.outputs)[:max(slots[1]) + 1]  # NHWC kernels make the data only
    return NhwcForm(op, op_domain, inputs, outputs, attributes, types, slots)


def nhwc_refusal(form: NhwcForm | None, node_attributes: dict[str, Any], used_outputs: int = 1,
                 inputs: int | None = None) -> str | None:
    """Why a node cannot take its NHWC form, or None."""
    if form is None:
        return "the op has no NHWC form here"
    if inputs is not None:
        missing_bias = is_biased(form.op) and inputs == len(form.inputs) - 1
        if inputs > len(form.inputs) or (inputs < len(form.inputs) and not missing_bias):
            return f"the NHWC form of {form.op} takes {len(form.inputs)} inputs, the node has {inputs}"
    if used_outputs > len(form.outputs):
        return f"the NHWC form of {form.op} produces {len(form.outputs)} output(s), the node uses {used_outputs}"
    extra = sorted(set(node_attributes) - set(form.attributes))
    if extra:
        return f"the NHWC form of {form.op} does not carry attribute(s) {', '.join(extra)}"
    return None


def register_nhwc(form: NhwcForm) -> domain.DomainOp:
    """The own-domain op of an NHWC form, registered once per name.

    Its function declares every attribute the op has at any opset, and its body (built for the model's
    opset) refers only to those the op has at that opset.
    """
    existing = domain.get_op(form.name)
    if existing is not None:
        return existing
    attributes = dict(form.attributes)
    if form.op_domain == "":
        for schema in defs.get_all_schemas_with_history():
            if schema.name == form.op and schema.domain == "":
                later = nhwc_form(form.op, "", schema.since_version)
                for name, default in later.attributes.items():
                    attributes.setdefault(name, default)
    op = domain.DomainOp(form.name, form.inputs, form.outputs, attributes,
                         functools.partial(_nhwc_body_at, form.op, form.op_domain, form),
                         f"{form.op} on NHWC tensors (NHWC data and weights; body transposes around {form.op})",
                         origin="worker.engine.passes.place")
    return domain.register_op(op)


def _nhwc_body_at(op: str, op_domain: str, fallback: NhwcForm, opset: int) -> list[NodeProto]:
    form = nhwc_form(op, op_domain, opset) if op_domain == "" else None
    return _nhwc_body(form or fallback, opset)


def _nhwc_body(form: NhwcForm, opset: int) -> list[NodeProto]:
    in_slots, out_slots = form.slots
    inner_in = [f"{n}_nchw" if i in in_slots else n for i, n in enumerate(form.inputs)]
    inner_out = [f"{n}_nchw" if i in out_slots else n for i, n in enumerate(form.outputs)]
    nodes = [helper.make_node("Transpose", [form.inputs[i]], [inner_in[i]], perm=list(TO_NCHW))
             for i in in_slots]
    if form.op_domain == domain.DOMAIN:
        nodes.extend(_inlined(domain.get_op(form.op), opset, inner_in, inner_out))
    else:
        node = helper.make_node(form.op, inner_in, inner_out)
        node.attribute.extend(domain.ref(name, name, form.attribute_types[name]) for name in form.attributes)
        nodes.append(node)
    nodes.extend(helper.make_node("Transpose", [inner_out[i]], [form.outputs[i]], perm=list(TO_NHWC))
                 for i in out_slots)
    return nodes


def _inlined(inner: domain.DomainOp, opset: int, inputs: list[str], outputs: list[str]) -> list[NodeProto]:
    """The body of an own-domain op with its formals renamed to ``inputs``/``outputs``, locals prefixed."""
    mapping = dict(zip(inner.inputs, inputs)) | dict(zip(inner.outputs, outputs))
    nodes = []
    for source in inner.body(opset):
        node = NodeProto()
        node.CopyFrom(source)
        node.input[:] = [mapping.get(n, f"inner_{n}") if n else "" for n in node.input]
        node.output[:] = [mapping.get(n, f"inner_{n}") if n else "" for n in node.output]
        nodes.append(node)
    return nodes


def complete_attributes(form: NhwcForm, attributes: dict[str, Any], weight_shape) -> dict[str, Any]:
    """Fill the attributes the NHWC form declares without a default (spatial rank from the weights)."""
    filled = dict(attributes)
    spatial = len(filled["kernel_shape"]) if "kernel_shape" in filled else (
        len(weight_shape) - 2 if weight_shape else 2)
    if "kernel_shape" in form.attributes and "kernel_shape" not in filled and weight_shape:
        filled["kernel_shape"] = [int(d) for d in weight_shape[2:]]
    for name, value in (("strides", 1), ("dilations", 1), ("output_padding", 0)):
        if name in form.attributes and form.attributes[name] is None and name not in filled:
            filled[name] = [value] * spatial
    if "pads" in form.attributes and "pads" not in filled:
        filled["pads"] = [0] * (2 * spatial)
    for name, default in form.attributes.items():  # onnx.reference does not apply function defaults
        if name not in filled and default is not None:
            filled[name] = default
    return filled

