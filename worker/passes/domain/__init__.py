"""Fusions into ops of the project's own ONNX domain (``mirserve``), defined by model-local functions.

Level 2 and skipped with ``--portable``. Importing the package defines the ops and registers the passes.
"""
from worker.passes.domain import activation_fuse, channel_shuffle, ops, qlinear  # noqa: F401  (registration)
