"""What every fusion into a standard ONNX op checks before emitting it: the model's opset has the op, and a
valid place has a kernel for it at that opset (a fusion never produces a node nothing can run)."""
from __future__ import annotations

from worker.engine.passes.base import PassContext


def standard_op_refusal(ctx: PassContext, op_type: str, since: int) -> str | None:
    """Why ``op_type`` (in the default domain since opset ``since``) may not be emitted here, or None."""
    opset = ctx.opset()
    if opset < since:
        return (f"{op_type} needs opset {since}, and the model imports opset {opset} (raise it with "
                f"--target-opset {since})")
    if ctx.kernels is not None and not ctx.kernels.has_kernel(op_type, "", ctx.places.targets, opset=opset):
        targets = ", ".join(sorted(ctx.places.targets))
        return f"no valid place ({targets}) has a {op_type} kernel at opset {opset}"
    return None
