"""``/passes`` and ``/targets``: what the engine can do, from the same registry and tables as the CLI."""
from __future__ import annotations

from fastapi import APIRouter

from app.problems import problem_responses
from app.schemas import PassInfo, TargetInfo

router = APIRouter(tags=["catalog"])


@router.get("/passes", response_model=list[PassInfo], responses=problem_responses())
def list_passes():
    """Every registered pass: kind, level, targets, kernels, origin and position in the default pipeline."""
    from worker.api import list_passes

    return list_passes()


@router.get("/targets", response_model=list[TargetInfo], responses=problem_responses())
def list_targets():
    """Every target a place may name, with its kernel tables when the engine provides them."""
    import worker.api

    if hasattr(worker.api, "list_targets"):
        return worker.api.list_targets()
    from worker.places import all_targets  # until the engine exposes list_targets()

    return [{"name": t.name, "memory_space": t.memory_space, "description": t.description, "origin": t.origin}
            for t in all_targets()]
