"""Fusions into standard ONNX ops (opt level 1): each module registers one pass on import."""
from worker.engine.passes.fuse import (  # noqa: F401  (registration)
    attention_fuse,
    bn_scale_fuse,
    conv_bn_fuse,
    conv_elementwise_fuse,
    conv_scale_fuse,
    fc_fuse,
    fold_scale_axis,
    gelu_fuse,
    gemm_bn_fuse,
    hard_swish_fuse,
    layer_norm_fuse,
    pad_conv_fuse,
    pad_pool_fuse,
    rms_norm_fuse,
    rotary_embedding_fuse,
    split_fuse,
)
