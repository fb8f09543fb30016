"""Derive a kernel's declared ports from an op schema (ONNX's, or onnxruntime's for its contrib ops).

Used by the table generator only: the committed tables carry the result. The rule: ports bound to the op's
primary type parameter (the type of its main output) follow the kernel's precision and layout (``same``),
except a variadic port whose values may differ in type (Loop's carried values), which takes each in its own
type (``each``);
every other port declares the one precision its types allow, or ``any``; inputs that hold shapes or axes are
read from host memory on a device target.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from worker.engine.kernels.ops import SHAPE_INPUTS
from worker.engine.kernels.schema import ANY, EACH, SAME, PortSpec

#: ONNX element type name -> precision; names missing here have no precision of their own (``any``).
TYPE_PRECISION = {"float": "fp32", "float16": "fp16", "int8": "int8", "uint8": "int8", "int32": "int32",
                  "int64": "int64", "bool": "bool"}


@dataclass(frozen=True)
class Formal:
    """A formal parameter, independent of which schema library described it."""

    name: str
    type_str: str
    optional: bool
    variadic: bool
    #: False for a variadic parameter whose values may each have their own type (Loop's and Scan's carried
    #: values, If's outputs): its port keeps every value's type instead of following the kernel's precision.
    homogeneous: bool = True


@dataclass(frozen=True)
class OpSignature:
    inputs: tuple[Formal, ...]
    outputs: tuple[Formal, ...]
    #: type parameter -> allowed element type names
    params: dict

    def key(self) -> tuple:
        return (self.inputs, self.outputs)


def element_name(type_str: str) -> str | None:
    """'tensor(float)' -> 'float'; sequences, maps and optionals have no element name."""
    if type_str.startswith("tensor(") and type_str.endswith(")"):
        return type_str[len("tensor("):-1]
    return None


#: Type parameters onnxruntime binds together where the schema lets them differ: Attention's CPU kernel is
#: registered for one float type (T1 = T2), so a float16 V beside float Q and K finds no kernel and the op's
#: function body, tried instead, fails to type-check ("MatMul bound to different types").
RUNTIME_TIED = {("Attention", ""): {"T2": "T1"}}


def signature(schema) -> OpSignature:
    """Read an onnx.defs.OpSchema or an onnxruntime schemadef into an OpSignature."""
    tied = RUNTIME_TIED.get((schema.name, schema.domain), {})

    def formal(param) -> Formal:
        option = str(param.option)
        type_str = getattr(param, "type_str", None) or getattr(param, "typeStr")
        return Formal(param.name, tied.get(type_str, type_str), option.endswith("Optional"),
                      option.endswith("Variadic"), getattr(param, "is_homogeneous", True))

    params = {}
    for constraint in schema.type_constraints:
        names = [element_name(t) for t in constraint.allowed_type_strs]
        params[constraint.type_param_str] = tuple(sorted(n for n in names if n))
    return OpSignature(tuple(formal(p) for p in schema.inputs), tuple(formal(p) for p in schema.outputs),
                       params)


#: Ops whose precision is that of their first input whatever their output is (dequantization reads int8).
INPUT_PRECISION_OPS = frozenset({"DequantizeLinear"})


def primary_param(sig: OpSignature, op: str = "") -> str | None:
    """The type parameter the kernel's precision names: output 0's, if an input shares it, else input 0's."""
    input_params = [f.type_str for f in sig.inputs if f.type_str in sig.params]
    if op in INPUT_PRECISION_OPS and input_params:
        return input_params[0]
    if sig.outputs and sig.outputs[0].type_str in sig.params and sig.outputs[0].type_str in input_params:
        return sig.outputs[0].type_str
    return input_params[0] if input_params else None


def precision_of_types(types: Iterable[str]) -> str:
    """The one precision a set of element types maps to, or ``any``."""
    found = {TYPE_PRECISION.get(t, ANY) for t in types}
    return found.pop() if len(found) == 1 else ANY


def precisions_of_types(types: Iterable[str]) -> tuple[list[str], list[str]]:
    """The kernel precisions one registration over ``types`` amounts to.

    A registration over a single precision's types is a kernel of that precision; one that spans several
    precisions is a type-generic kernel (Paddle-Lite's kAny), returned as no concrete precision and every
    type for an ``any`` kernel. Returns (concrete precisions, element types of the ``any`` kernel).
    """
    types = sorted(set(types))
    concrete = sorted({TYPE_PRECISION[t] for t in types if t in TYPE_PRECISION})
    rest = [t for t in types if t not in TYPE_PRECISION]
    if len(concrete) > 1:
        return [], types
    return concrete, rest


def ports(sig: OpSignature, op: str, *, device: bool, param_types: dict | None = None,
          layout_slots: tuple[Sequence[int], Sequence[int]] | None = None) -> tuple[list[PortSpec], list[PortSpec]]:
    """Declared inputs and outputs of a kernel of ``op`` with signature ``sig``.

    ``param_types`` narrows type parameters to what the kernel registers (onnxruntime's type constraints).
    Every port follows the kernel's layout (only rank-4 tensors have one, so shape and scalar inputs are
    unaffected), except on NHWC kernels, where ``layout_slots`` names the ports that carry NHWC data and
    the others read plain (nchw) tensors.
    """
    primary = primary_param(sig, op)
    types = dict(sig.params)
    types.update(param_types or {})
    shape_inputs = SHAPE_INPUTS.get(op, frozenset())

    def port(formal: Formal, slot: int, is_input: bool) -> PortSpec:
        bound = formal.type_str == primary and primary is not None and formal.homogeneous
        allowed = None
        if bound:
            precision = SAME
        elif not formal.homogeneous:  # each value its own type, whatever the kernel's precision
            precision, allowed = EACH, tuple(sorted(types.get(formal.type_str, ()))) or None
        elif formal.type_str in types:
            precision = precision_of_types(types[formal.type_str])
            allowed = tuple(sorted(types[formal.type_str])) if precision == ANY else None
        else:
            name = element_name(formal.type_str)
            precision = TYPE_PRECISION.get(name, ANY) if name else ANY
            allowed = (name,) if name and precision == ANY else None
        if layout_slots is not None:
            layout = SAME if slot in (layout_slots[0] if is_input else layout_slots[1]) else "nchw"
        else:
            layout = SAME
        target = "host" if device and is_input and slot in shape_inputs else None
        return PortSpec(formal.name, precision, layout, target, formal.optional, formal.variadic, allowed or None)

    return ([port(f, i, True) for i, f in enumerate(sig.inputs)],
            [port(f, i, False) for i, f in enumerate(sig.outputs)])
