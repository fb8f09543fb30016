"""Passes: the registry, the manager, the pipelines, and every built-in pass (registered on import)."""
from worker.passes.base import Pass, PassContext, PassInfo, PassKind, PassResult
from worker.passes.manager import PassManager
from worker.passes.pipelines import FixedPoint, Pipeline, get_pipeline
from worker.passes.registry import REGISTRY, register_pass

from worker.passes.analysis import type_inference  # noqa: E402,F401  (registration)
from worker.passes import domain  # noqa: E402,F401  (registration)
from worker.passes import fuse  # noqa: E402,F401  (registration)
from worker.passes import replace  # noqa: E402,F401  (registration)
from worker.passes import place  # noqa: E402,F401  (registration)
from worker.passes.memory import memory_plan  # noqa: E402,F401  (registration)
from worker.passes import fold  # noqa: E402,F401  (registration)
from worker.passes import eliminate  # noqa: E402,F401  (registration)
from worker.plugins import stages  # noqa: E402,F401  (the filter stages of plugins)

__all__ = ["FixedPoint", "Pass", "PassContext", "PassInfo", "PassKind", "PassManager", "PassResult",
           "Pipeline", "REGISTRY", "get_pipeline", "register_pass"]
