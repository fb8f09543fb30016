"""Memory estimates: live intervals, an arena plan at (or near) the lower bound, and the figures that judge it.

``liveness`` turns an execution order into buffers, ``planner`` places them, ``paddle_lite`` gives the
comparison figure, ``report`` and ``timeline_svg`` present the result. All of it works on plain data; the
``memory_plan`` pass (worker/engine/passes/memory) is the only part that reads the IR.
"""
from worker.engine.memory.liveness import (InPlaceDecision, Interval, Liveness, Step, ValueFacts, analyze,
                                    live_profile)
from worker.engine.memory.paddle_lite import paddle_lite_clusters, paddle_lite_style_bytes
from worker.engine.memory.plan import ALIGNMENT, ArenaPlan, Buffer, LiveProfile, Placement, aligned
from worker.engine.memory.planner import ORDERINGS, plan_arena, plan_spaces
from worker.engine.memory.report import arena_report
from worker.engine.memory.timeline_svg import render_timeline

__all__ = [
    "ALIGNMENT", "ArenaPlan", "Buffer", "InPlaceDecision", "Interval", "LiveProfile", "Liveness", "ORDERINGS",
    "Placement", "Step", "ValueFacts", "aligned", "analyze", "arena_report", "live_profile",
    "paddle_lite_clusters", "paddle_lite_style_bytes", "plan_arena", "plan_spaces", "render_timeline",
]
