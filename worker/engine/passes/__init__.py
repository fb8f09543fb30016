"""Passes: the registry, the manager, the pipelines, and every built-in pass (registered on import)."""
from worker.engine.passes.base import Pass, PassContext, PassInfo, PassKind, PassResult
from worker.engine.passes.manager import PassManager
from worker.engine.passes.pipelines import FixedPoint, Pipeline, get_pipeline
from worker.engine.passes.registry import REGISTRY, register_pass

from worker.engine.passes.analysis import type_inference  # noqa: E402,F401  (registration)
from worker.engine.passes import cut  # noqa: E402,F401  (registration)
from worker.engine.passes import mirserve_fuse  # noqa: E402,F401  (registration)
from worker.engine.passes import fuse  # noqa: E402,F401  (registration)
from worker.engine.passes import replace  # noqa: E402,F401  (registration)
from worker.engine.passes import place  # noqa: E402,F401  (registration)
from worker.engine.passes.memory import memory_plan  # noqa: E402,F401  (registration)
from worker.engine.passes import fold  # noqa: E402,F401  (registration)
from worker.engine.passes import eliminate  # noqa: E402,F401  (registration)
from worker.engine.plugins import stages  # noqa: E402,F401  (the filter stages of plugins)

__all__ = ["FixedPoint", "Pass", "PassContext", "PassInfo", "PassKind", "PassManager", "PassResult",
           "Pipeline", "REGISTRY", "get_pipeline", "register_pass"]
