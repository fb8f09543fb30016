"""Replacements by standard ONNX ops (opt level 2): each module registers one pass on import."""
from worker.engine.passes.replace import (  # noqa: F401  (registration)
    adaptive_pool_global_replace,
    conv_gemm_replace,
    prelu_leaky_relu_replace,
    reduction_global_pool_replace,
    simplify_inference,
    transpose_softmax_transpose_fuse,
)
