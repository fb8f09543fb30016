"""The plugin API: what a plugin file imports to extend mirserve without forking it.

    from worker.engine.plugins import LAYER_FIRST, PRIORITY_PRE, PassResult, register_filter, register_pass

A plugin is a Python file (or an installed package's ``mirserve.plugins`` entry point) that registers, when
it is loaded: passes (``register_pass``, the built-ins' decorator), filters bound to an op type or to every
node with a priority (``register_filter``), whole-graph callbacks before and after the filter stages
(``register_pre_callback`` / ``register_post_callback``), pipelines (``register_pipeline`` with fixed steps,
``pipeline_builder`` to choose passes from each run's options), targets (``register_target``), ops of the
mirserve domain (``register_op``), kernel table entries (``register_kernels``, for a new target too).
Everything carries the plugin's origin into the listings and the trace.
See ``discovery`` for where plugins are found and ``filters`` for the priority bands.
"""
from worker.engine.mirserve_domain.ops import DomainOp
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.pipelines import FixedPoint, Pipeline
from worker.engine.passes.registry import register_pass
from worker.engine.plugins.filters import (BANDS, LAYER_FIRST, LAYER_LAST, MAX_PRIORITY, PRIORITY_DOMAIN, PRIORITY_POST,
                                    PRIORITY_PRE, PRIORITY_SIMPLIFY)
from worker.engine.plugins.loader import PLUGINS
from worker.engine.plugins.register import (current_origin, default_steps, pipeline_builder, register_filter,
                                     register_kernels, register_op, register_pipeline, register_post_callback,
                                     register_pre_callback, register_target)

__all__ = ["BANDS", "DomainOp", "FixedPoint", "LAYER_FIRST", "LAYER_LAST", "MAX_PRIORITY", "PLUGINS",
           "PRIORITY_DOMAIN", "PRIORITY_POST", "PRIORITY_PRE", "PRIORITY_SIMPLIFY", "PassContext", "PassKind",
           "PassResult", "Pipeline", "current_origin", "default_steps", "pipeline_builder", "register_filter",
           "register_kernels", "register_op", "register_pass", "register_pipeline", "register_post_callback",
           "register_pre_callback", "register_target"]
