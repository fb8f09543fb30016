"""``/healthz`` (the process answers), ``/readyz`` (it can do work), ``/metrics`` (Prometheus text)."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from app import services as jobs
from app.auth import authenticate_metrics
from app.deps import ServicesDep
from app.problems import problem_response, problem_responses
from app.schemas import Liveness, Readiness
from worker.engine.api import __version__

router = APIRouter(tags=["health"])
PROMETHEUS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@router.get("/healthz", response_model=Liveness, responses=problem_responses())
def healthz():
    """Liveness: the API process answers (it checks nothing else)."""
    return Liveness(status="ok", version=__version__)


@router.get("/readyz", response_model=Readiness, responses=problem_responses(503))
def readyz(request: Request, services: ServicesDep):
    """Readiness: the database, the storage, the queue and at least one worker (by its heartbeat); the plugins
    found, a failed one with its error (it does not make the service unready)."""
    from worker.engine.api import list_plugins

    checks, plugins = jobs.readiness(services), list_plugins()
    if all(c["ok"] for c in checks.values()):
        return Readiness(status="ready", checks=checks, plugins=plugins)
    failing = ", ".join(name for name, c in checks.items() if not c["ok"])
    return problem_response(request, 503, slug="not-ready", detail=f"not ready: {failing}", checks=checks,
                            plugins=plugins, headers={"Retry-After": "5"})


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(authenticate_metrics)],
            responses={200: {"content": {PROMETHEUS_MEDIA_TYPE: {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format 0.0.4."},
                       **problem_responses(401)})
def metrics(services: ServicesDep):
    """Request counts and latencies, jobs by status, queue length, live workers. An API key is needed only
    where the operator set MIRSERVE_METRICS_AUTH=1."""
    text = services.metrics.render(lambda: _gauges(services))
    return PlainTextResponse(text, media_type=PROMETHEUS_MEDIA_TYPE)


def _gauges(services) -> list[str]:
    lines = ["# HELP mirserve_jobs Jobs in the job table, by status.", "# TYPE mirserve_jobs gauge"]
    for state, count in services.store.counts().items():
        lines.append(f'mirserve_jobs{{status="{state.value}"}} {count}')
    lines += ["# HELP mirserve_queue_messages Messages waiting in the queue.",
              "# TYPE mirserve_queue_messages gauge", f"mirserve_queue_messages {services.queue.pending()}"]
    lines += ["# HELP mirserve_pass_failures_total Passes that failed and were undone (the jobs went on without "
              "them), over the jobs the table holds.", "# TYPE mirserve_pass_failures_total counter",
              f"mirserve_pass_failures_total {services.store.pass_failures()}"]
    workers = services.store.live_workers(services.settings.lease_seconds)
    lines += ["# HELP mirserve_workers Workers that sent a heartbeat within the lease time.",
              "# TYPE mirserve_workers gauge", f"mirserve_workers {len(workers)}",
              "# HELP mirserve_jobs_running_in_workers Jobs the live workers report running.",
              "# TYPE mirserve_jobs_running_in_workers gauge",
              f"mirserve_jobs_running_in_workers {sum(w['running'] for w in workers)}"]
    return lines
