"""``/passes`` and ``/targets``: what the engine can do, from the same registry and kernel tables as the CLI."""
from __future__ import annotations

from fastapi import APIRouter, Query

from app.problems import problem_responses
from app.schemas import PassCatalog, TargetInfo

router = APIRouter(tags=["catalog"])


@router.get("/passes", response_model=PassCatalog, responses=problem_responses())
def list_passes():
    """Every pass (kind, level, targets, kernels, origin, position in the default pipeline), every plugin
    filter and callback, every pipeline, and every plugin found, loaded or failed with its error."""
    from worker.engine.api import list_all

    return list_all()


@router.get("/targets", response_model=list[TargetInfo], responses=problem_responses(422))
def list_targets(kernels: bool = True,
                 op: str | None = Query(None, max_length=200, description=(
                     "only the targets with a kernel for this op, and only those kernels (domain-qualified "
                     "outside the default domain: Conv, mirserve.FusedConvRelu); none: an empty list"))):
    """Every target a place may name: its memory space, the source of its kernel table and (unless
    ``kernels=false``) its kernels: op, opset range, precision, layout."""
    from worker.engine.api import list_targets

    targets = list_targets(op=op)
    for target in targets:
        target["kernel_count"] = len(target.get("kernels") or [])
        if not kernels:
            target["kernels"] = None
    return targets
