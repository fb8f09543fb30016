"""Fusions into standard ONNX ops (opt level 1): each module registers one pass on import."""
from worker.passes.fuse import bn_scale, conv_bn, conv_elementwise, conv_scale  # noqa: F401
