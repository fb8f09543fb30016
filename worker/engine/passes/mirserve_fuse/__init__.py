"""Fusions into ops of the project's own ONNX domain (``mirserve``), defined by model-local functions.

Level 2 and skipped with ``--portable``. Importing the package defines the ops and registers the passes.
"""
from worker.engine.passes.mirserve_fuse import (  # noqa: F401  (registration)
    add_layer_norm_fuse,
    conv_activation_fuse,
    elementwise_activation_fuse,
    gemm_activation_fuse,
    qlinear_fuse,
    shuffle_channel_fuse,
    transformer_domain_fuse,
)
