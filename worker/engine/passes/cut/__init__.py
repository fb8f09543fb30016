"""Selecting part of a model before optimizing it: cut_subgraph. Registered on import."""
from worker.engine.passes.cut import cut_subgraph  # noqa: F401  (registration)
