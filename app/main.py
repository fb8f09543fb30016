"""Builds the FastAPI application; nothing else happens here."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from app.auth import authenticate, check_exposure
from app.deps import one_value_per_query_parameter
from app.metrics import Metrics, MetricsMiddleware
from app.openapi import install_openapi
from app.problems import install_problem_handlers, problem_responses
from app.routes import catalog, health, jobs, optimize, pictures
from app.web.routes import install_web
from app.services import Services
from app.settings import Settings
from worker.engine.api import __version__
from worker.jobs import JobFiles, JobQueue, JobStore, open_storage

DESCRIPTION = """Optimize ONNX models for target places over HTTP.

POST a model to `/optimize` with places in priority order; poll `/jobs/{id}` until it has succeeded; download
`/jobs/{id}/artifact` and read `/jobs/{id}/trace` and `/jobs/{id}/memory`. Every error, including unknown
paths (404) and methods (405), is an RFC 9457 `application/problem+json` document.
"""


def build_services(settings: Settings) -> Services:
    store = JobStore(settings.effective_database_url)
    store.check_schema()
    files = JobFiles(open_storage(settings.storage_url, settings.data_dir))
    return Services(settings=settings, store=store, files=files, queue=JobQueue.connect(settings),
                    metrics=Metrics())


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    settings = settings or Settings()
    check_exposure(settings)
    services = services or build_services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        services.close()

    # /docs is served by app.web with vendored Swagger UI assets (FastAPI's would load them from a CDN).
    app = FastAPI(title="mirserve", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  dependencies=[Depends(one_value_per_query_parameter)])
    app.state.services = services
    install_problem_handlers(app)
    for module in (optimize, jobs, pictures, catalog):  # every route of these needs a key (app.auth)
        app.include_router(module.router, dependencies=[Depends(authenticate)], responses=problem_responses(401))
    app.include_router(health.router)
    install_web(app)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    install_openapi(app)
    return app
