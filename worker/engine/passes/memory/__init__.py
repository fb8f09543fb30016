"""Memory planning passes (registered on import)."""
from worker.engine.passes.memory import memory_plan  # noqa: F401
