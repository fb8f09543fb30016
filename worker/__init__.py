"""mirserve's engine: an ONNX optimizer that plans for target places (no web imports here)."""
__version__ = "0.1.0"
