"""What every fusion into a ``mirserve`` op checks: its body exists at the opset, the element type, a kernel."""
from __future__ import annotations

from onnx import TensorProto, helper

from worker.engine.mirserve_domain.fused import body_info
from worker.engine.mirserve_domain.ops import DOMAIN
from worker.engine.passes.base import PassContext


def emit_refusal(ctx: PassContext, op_name: str, dtype: int) -> str | None:
    """Why ``op_name`` may not be emitted for data of ``dtype`` in this model and these places, or None."""
    opset = ctx.opset("")
    info = body_info(op_name, opset)
    if info.unavailable:
        return f"the {DOMAIN}.{op_name} body cannot be written: {info.unavailable}"
    if dtype == 0:
        return "the element type of its data is unknown"
    if info.float32_only and dtype != TensorProto.FLOAT:
        return (f"its body holds float32 constants, which only EyeLike (opset 9) or CastLike (opset 15) can "
                f"give another type, and the data is {_type_name(dtype)} at opset {opset}")
    if ctx.kernels is not None and not ctx.kernels.has_kernel(op_name, DOMAIN, ctx.places.targets):
        targets = ", ".join(sorted(ctx.places.targets))
        return f"no valid place ({targets}) has a {DOMAIN}.{op_name} kernel"
    return None


def _type_name(dtype: int) -> str:
    return helper.tensor_dtype_to_string(dtype).replace("TensorProto.", "").lower()
