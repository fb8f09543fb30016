"""Replacements by standard ONNX ops (opt level 2): each module registers one pass on import."""
from worker.passes.replace import (  # noqa: F401
    adaptive_pool_global, conv_gemm, prelu_leaky_relu, reduction_global_pool, simplify_inference,
    transpose_softmax_transpose,
)
