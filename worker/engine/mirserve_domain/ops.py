"""The project's own ONNX domain: fused ops and casts that a target runs as one kernel.

Each op is defined by a model-local ONNX function whose body is standard ops, so onnxruntime and
``onnx.reference`` still run a model that uses them. The writer emits the function of every domain op the
model uses, and only those, built for the model's default opset.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from onnx import AttributeProto, FunctionProto, NodeProto, helper

from worker.engine.origin import BUILT_IN, current_origin

if TYPE_CHECKING:
    from worker.engine.ir.model import Model

DOMAIN = "mirserve"
VERSION = 1


@dataclass(frozen=True)
class DomainOp:
    """An op of the ``mirserve`` domain and the standard-op body that defines it."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: Attributes the body reads with ``ref_attr_name``, with their defaults (None: required).
    attributes: dict[str, object | None]
    #: Builds the body for a model's default-domain opset version.
    body: Callable[[int], Sequence[NodeProto]]
    description: str
    origin: str = "built-in"

    def function(self, opset: int) -> FunctionProto:
        required = [name for name, default in self.attributes.items() if default is None]
        defaults = [helper.make_attribute(name, default) for name, default in self.attributes.items()
                    if default is not None]
        return helper.make_function(DOMAIN, self.name, list(self.inputs), list(self.outputs),
                                    list(self.body(opset)), [helper.make_opsetid("", opset)],
                                    attributes=required, attribute_protos=defaults or None,
                                    doc_string=self.description)


_OPS: dict[str, DomainOp] = {}


def register_op(op: DomainOp) -> DomainOp:
    """Define a domain op; one defined while a plugin loads is that plugin's (``worker.engine.origin``)."""
    if op.origin == BUILT_IN and current_origin() != BUILT_IN:
        op = dataclasses.replace(op, origin=current_origin())
    existing = _OPS.get(op.name)
    if existing is not None and existing is not op:
        raise ValueError(f"{DOMAIN} op {op.name!r} is already defined by {existing.origin}")
    _OPS[op.name] = op
    return op


def unregister_op(name: str, *, force: bool = False) -> None:
    """Remove an op a plugin defined; built-in ops stay unless ``force`` (see ``places.unregister_target``)."""
    op = _OPS.get(name)
    if op is not None and (force or op.origin != BUILT_IN):
        del _OPS[name]


def get_op(name: str) -> DomainOp | None:
    return _OPS.get(name)


def all_ops() -> list[DomainOp]:
    return list(_OPS.values())


def ref(name: str, attr_name: str, attr_type: int) -> AttributeProto:
    """An attribute of a body node that takes its value from the function's attribute ``attr_name``."""
    attr = AttributeProto(name=name, ref_attr_name=attr_name, type=attr_type)
    return attr


def functions_for(model: "Model") -> list[FunctionProto]:
    """The function definitions of the domain ops ``model`` uses, in name order."""
    used = sorted({op for graph in model.graph.all_graphs() for dom, op in graph.op_types() if dom == DOMAIN})
    if not used:
        return []
    defined = model.function_keys()
    functions = []
    for name in used:
        if (DOMAIN, name) in defined:
            continue
        op = _OPS.get(name)
        if op is None:
            raise ValueError(f"the model uses {DOMAIN}.{name}, which no module defines")
        functions.append(op.function(model.opset("")))
    return functions
