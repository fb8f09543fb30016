"""Values for the scalar inputs that steer a model, for verification: which branches its inputs choose.

Verification draws integers from 0 to 99 and booleans by a coin. A model whose control flow depends on a
scalar input takes one branch at most on such a draw, or none of the ones it was made for: a voice-activity
detector compares its sample rate with 16000 and 8000 and runs one sub-network or the other, a model with a
boolean flag runs the If it feeds one way. A rewrite in a branch verification never runs would go unproven.

So, before the pipeline, each scalar integer or boolean graph input is followed through the ops that pass its
value on unchanged (Cast, Squeeze, Reshape, ...; Not for a boolean), in the main graph and in subgraphs:

- an integer compared (Equal, Less, Greater, ...) with a scalar constant takes each constant it is compared
  with, the nearest comparisons first, and then a usual draw (``None``): the other side of every
  comparison (a sample rate of neither 16000 nor 8000 is what such a model's last branch gets);
- a boolean that decides an If, a Loop's condition or a Where takes true and false.

Verification then runs once per value (the largest number of values any input has, at most
``MAX_VALUES``), input k taking its values in turn; the other inputs are drawn as before.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

#: Ops whose output holds their first input's value (its type or shape aside).
PASS_THROUGH = frozenset({"Cast", "CastLike", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Expand"})
COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
#: Where a boolean decides control flow: op -> the input slot of its condition.
CONDITIONS = {"If": 0, "Loop": 1, "Where": 0}
INTEGERS = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
                      TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})
#: The most values one input takes (and so the most runs this adds).
MAX_VALUES = 4
#: How many pass-through ops a walk follows from an input.
MAX_DEPTH = 8


def steering_values(graph) -> dict[str, list]:
    """``{input name: [values]}`` for the scalar inputs whose value steers the graph (see the module doc)."""
    found: dict[str, list] = {}
    for value in graph.inputs:
        if value.is_initializer or value.numel() != 1:
            continue
        if value.dtype == TensorProto.BOOL:
            if _decides(value):
                found[value.name] = [True, False]
        elif value.dtype in INTEGERS:
            limits = np.iinfo(helper.tensor_dtype_to_np_dtype(value.dtype))
            compared = [c for c in _compared_with(value) if limits.min <= c <= limits.max]  # values it can hold
            if compared:
                found[value.name] = [*compared[:MAX_VALUES - 1], None]
    return found


def runs_for(values: dict[str, list]) -> int:
    """How many runs give every input each of its values."""
    return max((len(v) for v in values.values()), default=1)


def describe(values: dict[str, list]) -> str:
    """``sr 16000 / drawn, flag true / false``: the steering inputs and the values their runs took."""
    def text(v) -> str:
        return "drawn" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    return ", ".join(f"{name} {' / '.join(text(v) for v in chosen)}" for name, chosen in values.items())


def _carriers(value):
    """The value and the values pass-through ops (and Not) make of it, in the order the graph uses them."""
    seen, frontier, depth = [value], [value], 0
    while frontier and depth < MAX_DEPTH:
        following = []
        for current in frontier:
            for use in current.uses:
                node = use.node
                if use.slot == 0 and (node.op_type in PASS_THROUGH or node.op_type == "Not") and node.outputs:
                    out = node.outputs[0]
                    if out is not None and out not in seen:
                        seen.append(out)
                        following.append(out)
        frontier, depth = following, depth + 1
    return seen


def _decides(value) -> bool:
    return any(use.slot == CONDITIONS.get(use.node.op_type) for carrier in _carriers(value) for use in carrier.uses)


def _compared_with(value) -> list:
    constants: list = []
    for carrier in _carriers(value):
        for use in carrier.uses:
            node = use.node
            if node.op_type not in COMPARISONS or len(node.inputs) != 2:
                continue
            other = node.inputs[1 - use.slot]
            constant = other.constant_value() if other is not None else None
            if constant is None or np.size(constant) != 1:
                continue
            number = np.asarray(constant).reshape(()).item()
            if isinstance(number, float):
                if not number.is_integer():
                    continue
                number = int(number)
            if isinstance(number, int) and number not in constants:
                constants.append(number)
    return constants
