"""Memory planning passes (registered on import)."""
from worker.passes.memory import memory_plan  # noqa: F401
