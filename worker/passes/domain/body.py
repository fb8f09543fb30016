"""Building the standard-op bodies of the fused ops, valid for one default-domain opset.

Two measured limits shape every body. ``onnx.reference`` cannot pass a referenced attribute
(``ref_attr_name``) to its unary and binary op classes (LeakyRelu, HardSigmoid, Mul, ...): only ops such as
Conv, Gemm, Constant and EyeLike take one. So an activation parameter enters the body as a tensor made from
the attribute, and the parameterised activations are written with ops that take tensors (PRelu, Mul, Add,
Clip). And a function body has no overloads per element type: a float constant is float32 unless CastLike
(opset 15) can give it the data's type, so below opset 15 a body with constants is valid for float32 only.
"""
from __future__ import annotations

import numpy as np
from onnx import AttributeProto, NodeProto, helper, numpy_helper

from worker.domain import ref


class UnsupportedOpset(ValueError):
    """The body of a fused op cannot be written with the ops of this opset."""


class BodyBuilder:
    """Accumulates the nodes of one function body; remembers whether it is valid for float32 only."""

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: list[NodeProto] = []
        #: Set when a float32 constant could not be cast to the data's type (opset below 15).
        self.float32_only = False
        self._count = 0

    def require(self, since: int, what: str) -> None:
        if self.opset < since:
            raise UnsupportedOpset(f"{what} needs opset {since} or later, the model has opset {self.opset}")

    def op(self, op_type: str, inputs: list[str], *, out: str | None = None,
           refs: tuple[AttributeProto, ...] = (), **attributes) -> str:
        """Append a node; ``refs`` are attributes taking their value from the function's (``ref``)."""
        self._count += 1
        out = out or f"{op_type.lower()}_{self._count}"
        node = helper.make_node(op_type, inputs, [out], **attributes)
        node.attribute.extend(refs)
        self.nodes.append(node)
        return out

    def constant(self, array: np.ndarray) -> str:
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(array)))

    def float_constant(self, value: float, like: str) -> str:
        """A scalar of the type of ``like``."""
        return self.cast_like(self.constant(np.array(value, dtype=np.float32)), like)

    def cast_like(self, name: str, like: str) -> str:
        if self.opset >= 15:
            return self.op("CastLike", [name, like])
        self.float32_only = True
        return name

    def float_attribute(self, attribute: str, like: str) -> str:
        """A scalar of the type of ``like`` holding the float function attribute ``attribute``.

        From opset 12 a Constant takes it (``value_float``); before, Gemm(1, 1, 0) with ``alpha`` referring
        to it is the op both runtimes evaluate that turns a float attribute into a tensor.
        """
        if self.opset >= 12:
            scalar = self.op("Constant", [], refs=(ref("value_float", attribute, AttributeProto.FLOAT),))
            return self.cast_like(scalar, like)
        self.require(7, "a float attribute as a tensor")
        one = self.constant(np.ones((1, 1), dtype=np.float32))
        zero = self.constant(np.zeros((1, 1), dtype=np.float32))
        matrix = self.op("Gemm", [one, one, zero], refs=(ref("alpha", attribute, AttributeProto.FLOAT),))
        scalar = self.op("Reshape", [matrix, self.constant(np.zeros((0,), dtype=np.int64))])
        return self.cast_like(scalar, like)

    def int_attribute(self, attribute: str, above: str) -> str:
        """A 1-D int64 tensor [v] holding the int function attribute ``attribute``.

        From opset 12 a Constant takes it (``value_int``). Before, EyeLike(k=v) over a zero row of ``above``
        columns (a 1-D int64 tensor [n] with n > v) puts a one at column v, and ArgMax reads v back.
        """
        if self.opset >= 12:
            scalar = self.op("Constant", [], refs=(ref("value_int", attribute, AttributeProto.INT),))
            return self.op("Reshape", [scalar, self.constant(np.array([1], dtype=np.int64))])
        self.require(9, "an int attribute as a tensor")
        dims = self.op("Concat", [self.constant(np.array([1], dtype=np.int64)), above], axis=0)
        row = self.op("ConstantOfShape", [dims])
        eye = self.op("EyeLike", [row], refs=(ref("k", attribute, AttributeProto.INT),))
        return self.op("ArgMax", [eye], axis=1, keepdims=0)
