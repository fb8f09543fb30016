"""Pictures of a job: ``/jobs/{id}/trace.svg``, ``/jobs/{id}/memory/timeline.svg``, ``/jobs/{id}/graph.svg``
(the Chrome trace-event form is ``/jobs/{id}/trace?format=chrome``)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import FileResponse

from app import pictures
from app.deps import JobDep, ServicesDep
from app.problems import problem_responses

router = APIRouter(prefix="/jobs", tags=["pictures"])
SVG_MEDIA_TYPE = "image/svg+xml"
SVG = {200: {"content": {SVG_MEDIA_TYPE: {"schema": {"type": "string"}}}, "description": "An SVG document."}}


@router.get("/{job_id}/trace.svg", response_class=Response, responses={**SVG, **problem_responses(404, 409)})
def get_trace_svg(job: JobDep, services: ServicesDep):
    """The pass trace as a timeline: a row per pass, a bar per run, fixed-point rounds shaded."""
    return Response(pictures.trace_svg(services, job), media_type=SVG_MEDIA_TYPE)


@router.get("/{job_id}/memory/timeline.svg", response_class=Response,
            responses={**SVG, **problem_responses(404, 409, 422)})
def get_memory_timeline(job: JobDep, services: ServicesDep,
                        space: Annotated[str | None, Query(max_length=64,
                                                           description="one memory space (default: all)")] = None):
    """Live bytes per step of each planned memory arena, the peak marked."""
    return Response(pictures.memory_timeline_svg(services, job, space), media_type=SVG_MEDIA_TYPE)


@router.get("/{job_id}/graph.svg", response_class=FileResponse, responses={**SVG, **problem_responses(404, 409, 503)})
def get_graph_svg(job: JobDep, services: ServicesDep):
    """The optimized graph, nodes coloured by place, casts marked (Graphviz; 503 where the server has none)."""
    return Response(pictures.graph_svg(services, job), media_type=SVG_MEDIA_TYPE)
