"""The web page: the job list with live status and a submit form at ``/``, a page per job at
``/ui/jobs/{id}``, the problem types explained at ``/problems/{slug}``, and the API docs at ``/docs`` with
vendored Swagger UI (no CDN, so they work offline). Server-rendered Jinja2 templates, a small script that
polls the JSON API, no build step. None of these pages are part of the API's OpenAPI document.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from app import services as jobs
from app.auth import PrincipalDep, authenticate
from app.deps import ServicesDep
from app.errors import NotFound
from app.problem_types import PROBLEM_TYPES
from worker.jobs import JobState

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters["bytes"] = lambda n: "-" if n is None else _human_bytes(n)
router = APIRouter(include_in_schema=False)
#: The pages that show jobs; with API keys they need one, like the API (and show only the owner's jobs).
jobs_router = APIRouter(include_in_schema=False, dependencies=[Depends(authenticate)])
PAGE_SIZE = 50


def install_web(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.include_router(jobs_router)
    app.include_router(router)


@jobs_router.get("/", response_class=HTMLResponse)
def index(request: Request, services: ServicesDep, principal: PrincipalDep):
    found, total = services.store.list(state=None, limit=PAGE_SIZE, offset=0, owner=principal.owner_filter)
    return templates.TemplateResponse(request, "index.html", {"jobs": [jobs.job_out(j) for j in found],
                                                              "total": total, "page_size": PAGE_SIZE})


@jobs_router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, services: ServicesDep, principal: PrincipalDep, job_id: str):
    job = jobs.get_job(services, job_id, principal)
    summary: dict[str, Any] | None = None
    if job.state is JobState.SUCCEEDED:
        try:
            summary = (jobs.report(services, job).to_dict().get("summary")) or None
        except NotFound:
            summary = None
    return templates.TemplateResponse(request, "job.html", {"job": jobs.job_out(job), "summary": summary})


@router.get("/problems/{slug}", response_class=HTMLResponse)
def problem_type(request: Request, slug: str):
    kind = PROBLEM_TYPES.get(slug)
    if kind is None:
        raise NotFound("problem-type-not-found", f"there is no problem type {slug!r}; the types are listed at "
                       f"/problems", field="slug")
    return templates.TemplateResponse(request, "problem.html", {"slug": slug, "kind": kind})


@router.get("/problems", response_class=HTMLResponse)
def problem_types(request: Request):
    return templates.TemplateResponse(request, "problems.html", {"types": sorted(PROBLEM_TYPES.items())})


@router.get("/docs", response_class=HTMLResponse)
def docs():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="mirserve API",
                               swagger_js_url="/static/swagger-ui/swagger-ui-bundle.js",
                               swagger_css_url="/static/swagger-ui/swagger-ui.css",
                               swagger_favicon_url="/static/swagger-ui/favicon-32x32.png",
                               swagger_ui_parameters={"validatorUrl": None})  # no call to swagger.io


def _human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
