"""Building the standard-op bodies of the fused ops, valid for one default-domain opset.

Two measured limits shape every body. ``onnx.reference`` cannot pass a referenced attribute
(``ref_attr_name``) to its unary and binary op classes (LeakyRelu, HardSigmoid, Mul, ...): only ops such as
Conv, Gemm, Constant and EyeLike take one. So an activation parameter enters the body as a tensor made from
the attribute, and the parameterised activations are written with ops that take tensors (PRelu, Mul, Add,
Clip). And a function body has no overloads per element type, while the place passes may later run a fused
op in fp16: so every number in a body takes the data's type. From opset 15 CastLike gives it; from 9 to 14,
Gemm(one, one, alpha=number) does, where ``one`` is EyeLike of a 1x1 slice of the data (EyeLike keeps its
input's type). Only below opset 9 (no EyeLike) is a body with numbers valid for float32 data only.
"""
from __future__ import annotations

import numpy as np
from onnx import AttributeProto, NodeProto, helper, numpy_helper

from worker.engine.mirserve_domain.ops import ref


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
        """A scalar of the type of ``like`` holding ``value``."""
        if 9 <= self.opset < 15:
            return self._typed_scalar(like, helper.make_attribute("alpha", float(value)))
        return self.cast_like(self.constant(np.array(value, dtype=np.float32)), like)

    def float_attribute(self, attribute: str, like: str) -> str:
        """A scalar of the type of ``like`` holding the float function attribute ``attribute``."""
        alpha = ref("alpha", attribute, AttributeProto.FLOAT)
        if self.opset >= 15:  # Constant takes a referenced value_float from opset 12
            scalar = self.op("Constant", [], refs=(ref("value_float", attribute, AttributeProto.FLOAT),))
            return self.cast_like(scalar, like)
        if self.opset >= 9:
            return self._typed_scalar(like, alpha)
        self.require(7, "a float attribute as a tensor")
        one = self.constant(np.ones((1, 1), dtype=np.float32))
        matrix = self.op("Gemm", [one, one, self.constant(np.zeros((1, 1), dtype=np.float32))], refs=(alpha,))
        return self.cast_like(self.op("Reshape", [matrix, self._int64([])]), like)

    def cast_like(self, name: str, like: str) -> str:
        if self.opset >= 15:
            return self.op("CastLike", [name, like])
        self.float32_only = True
        return name

    def _typed_scalar(self, like: str, alpha: AttributeProto) -> str:
        """Gemm(one, one, zero, alpha) reshaped to a scalar, in the type of ``like`` (opset 9 to 14)."""
        one = self._one_like(like)
        zero = self.op("Sub", [one, one])
        matrix = self.op("Gemm", [one, one, zero], refs=(alpha,), beta=0.0)
        return self.op("Reshape", [matrix, self._int64([])])

    def _one_like(self, like: str) -> str:
        """A [1, 1] one of the type of ``like``: EyeLike of the first element (EyeLike keeps the type)."""
        row = self.op("Reshape", [like, self._int64([1, -1])])
        if self.opset >= 10:
            first = self.op("Slice", [row, self._int64([0, 0]), self._int64([1, 1])])
        else:
            first = self.op("Slice", [row], starts=[0, 0], ends=[1, 1])
        return self.op("EyeLike", [first])

    def _int64(self, values: list[int]) -> str:
        return self.constant(np.array(values, dtype=np.int64))

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
