"""Replacements by standard ONNX ops (opt level 2): each module registers one pass on import."""
