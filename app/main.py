"""Builds the FastAPI application; nothing else happens here."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.metrics import Metrics, MetricsMiddleware
from app.openapi import install_openapi
from app.problems import install_problem_handlers
from app.routes import catalog, health, jobs, optimize
from app.services import Services
from app.settings import Settings
from worker import __version__
from worker.jobs.files import JobFiles
from worker.jobs.queue import JobQueue, build_huey
from worker.jobs.store import JobStore

DESCRIPTION = """Optimize ONNX models for target places over HTTP.

POST a model to `/optimize` with places in priority order; poll `/jobs/{id}` until it has succeeded; download
`/jobs/{id}/artifact` and read `/jobs/{id}/trace` and `/jobs/{id}/memory`. Every error, including unknown
paths (404) and methods (405), is an RFC 9457 `application/problem+json` document.
"""


def build_services(settings: Settings) -> Services:
    # Import the engine's registries now: done lazily by the first POST, it would hold the GIL for about a
    # second (numpy, onnx, every pass module) and stall every request in flight.
    import worker.api  # noqa: F401

    config = settings.job_config
    store = JobStore(config.database_url)
    store.create_schema()
    files = JobFiles(config.data_dir)
    files.ensure()
    return Services(settings=settings, store=store, files=files, queue=JobQueue(build_huey(config)),
                    metrics=Metrics())


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    settings = settings or Settings()
    services = services or build_services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        services.close()

    app = FastAPI(title="mirserve", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.state.services = services
    install_problem_handlers(app)
    for module in (optimize, jobs, catalog, health):
        app.include_router(module.router)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    install_openapi(app)
    return app
