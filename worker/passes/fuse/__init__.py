"""Fusions into standard ONNX ops (opt level 1): each module registers one pass on import."""
from worker.passes.fuse import (  # noqa: F401
    bn_scale, conv_bn, conv_elementwise, conv_scale, fc, fold_scale_axis, gelu, gemm_bn, hard_swish, layer_norm,
    pad_conv, pad_pool,
)
