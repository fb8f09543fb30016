"""BatchNormalization in inference mode as a per-channel affine map, and why one cannot be folded: shared by
conv_bn_fuse, gemm_bn_fuse and simplify_inference."""
from __future__ import annotations

from worker.engine.passes.support.weights import batchnorm_factors
from worker.engine.pattern import describe

STATISTICS = ("scale", "B", "input_mean", "input_var")


def batchnorm_refusal(bn, channels: int) -> str | None:
    """Why a BatchNormalization cannot be folded into something before it (None when it can)."""
    if bn.attr("training_mode", 0):
        return f"{describe(bn)} is in training mode"
    if bn.attr("spatial", 1) == 0:
        return f"{describe(bn)} has per-activation statistics (spatial=0)"
    for slot, name in enumerate(STATISTICS, start=1):
        value = bn.input(slot)
        data = None if value is None else value.constant_value()
        if data is None:
            return f"the BatchNormalization statistics of {describe(bn)} ({name}) are not constants"
        if data.size != channels or data.ndim != 1:
            return (f"the {name} of {describe(bn)} has shape {list(data.shape)}, "
                    f"not one value per channel ({channels})")
    return None


def batchnorm_affine(bn):
    """(a, b) with BatchNormalization(x) == x * a + b per channel, in float64."""
    stats = [bn.input(slot).constant_value() for slot in range(1, 5)]
    return batchnorm_factors(*stats, bn.attr("epsilon", 1e-5))
