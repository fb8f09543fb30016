"""eliminate_relu_before_quantize: a Relu or Clip read only by a QuantizeLinear whose saturation already clamps
as it does is dropped (onnxruntime's ReluQuantFusion / ClipQuantFusion), so the op before it meets the
QuantizeLinear and qlinear_fuse can make one int8 kernel of DequantizeLinear -> op -> QuantizeLinear.

    x -> Relu -> Q(s, z) -> y_q    becomes    x -> Q(s, z) -> y_q      (z the lowest value of y_q's type)
    x -> Clip(lo, hi) -> Q(s, z)   becomes    x -> Q(s, z)             (lo <= s * (qmin - z), hi >= s * (qmax - z))

Exact, bit for bit: QuantizeLinear computes saturate(round(x / s) + z) with a positive scale s. Every x at or
below lo is written as qmin either way (round(x / s) + z <= qmin after the clamp and before it), every x at or
above hi as qmax, and values between are untouched by the Clip. Post-training quantized exports (torchvision's
quantized models, the fbgemm / qnnpack flows) quantize each Conv + ReLU output with zero point 0 on uint8,
where the Relu is such a no-op.

Preconditions: per-tensor scale and zero point known offline, a positive scale, Clip's bounds constants (or
absent), the activation's result read only by the QuantizeLinear and no graph output.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.operands import constant_input, per_tensor_params
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules

#: The integer types QuantizeLinear writes whose range is known here, and their (lowest, highest) values.
RANGES = {dtype: (int(np.iinfo(helper.tensor_dtype_to_np_dtype(dtype)).min),
                  int(np.iinfo(helper.tensor_dtype_to_np_dtype(dtype)).max))
          for dtype in (TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16)}


class ActivationBeforeQuantize(Rule):
    name = "eliminate_relu_before_quantize"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        clamped = p.op(("Relu", "Clip"), p.var("x"), key="act", out="clamped")
        p.QuantizeLinear(clamped, key="quant", out="y_q")
        return p

    def check(self, ctx: PassContext, match: Match) -> bool | str:
        reason = _refusal(match.node("act"), match.node("quant"), ctx.opset(""))
        return True if reason is None else f"{match.node('act').op_type}: {reason}"

    def rewrite(self, ctx: PassContext, match: Match, plan: bool) -> Node:
        quant = match.node("quant")
        inputs: list[Value | None] = [match.value("x"), *quant.inputs[1:]]
        return match.graph.add_node("QuantizeLinear", inputs, [match.value("y_q")],
                                    attributes=dict(quant.attributes), name=quant.name, before=quant)


def _bounds(act: Node, opset: int) -> tuple[float, float] | str:
    """The activation's (lower, upper) clamp, or why it is not known."""
    if act.op_type == "Relu":
        return 0.0, float("inf")
    if opset < 11:
        return float(act.attr("min", -3.4028234663852886e38)), float(act.attr("max", 3.4028234663852886e38))
    bounds = []
    for slot, absent in ((1, -float("inf")), (2, float("inf"))):
        if act.input(slot) is None:
            bounds.append(absent)
            continue
        value = constant_input(act, slot)
        if value is None or value.size != 1:
            return "its bounds are not known offline"
        bounds.append(float(value.reshape(())))
    return bounds[0], bounds[1]


def _refusal(act: Node, quant: Node, opset: int) -> str | None:
    if act.input(0).dtype not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
        return "it clamps integers, which the QuantizeLinear does not read"
    params = per_tensor_params(quant)
    if params is None:
        return "the QuantizeLinear's scale or zero point is per axis or not known offline"
    if set(quant.attributes) - {"axis"}:
        return "the QuantizeLinear sets attributes beyond axis"
    out_type = quant.output(0).dtype
    if out_type not in RANGES:
        return "the QuantizeLinear writes a type whose range is not known here"
    scale, zero = params
    scale_value = float(scale.reshape(()))
    zero_value = 0 if zero is None else int(zero.reshape(()))
    if not scale_value > 0:
        return "the QuantizeLinear's scale is not positive"
    bounds = _bounds(act, opset)
    if isinstance(bounds, str):
        return bounds
    low, high = bounds
    qmin, qmax = RANGES[out_type]
    if not (low <= scale_value * (qmin - zero_value) and high >= scale_value * (qmax - zero_value)):
        return (f"it clamps to [{low:g}, {high:g}], inside the range the QuantizeLinear saturates to "
                f"([{scale_value * (qmin - zero_value):g}, {scale_value * (qmax - zero_value):g}])")
    return None


@register_pass(name="eliminate_relu_before_quantize", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="Relu / Clip -> QuantizeLinear whose saturation clamps alike -> the QuantizeLinear "
                           "alone")
def eliminate_relu_before_quantize(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [ActivationBeforeQuantize()])
