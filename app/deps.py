"""Dependency aliases: the service container, the request's principal, and a job loaded from its path id (or
a 404, also when the job is another owner's); and the rule every route's query string follows."""
from __future__ import annotations

from collections import Counter
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.exceptions import RequestValidationError

from app.auth import PrincipalDep
from app.services import Services, get_job
from worker.jobs import Job


async def get_services(request: Request) -> Services:
    # async: no I/O here, and a sync dependency would cost a thread-pool hop on every request.
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


def load_job(services: ServicesDep, principal: PrincipalDep,
             job_id: Annotated[str, Path(description="the job id")]) -> Job:
    return get_job(services, job_id, principal)


JobDep = Annotated[Job, Depends(load_job)]


async def one_value_per_query_parameter(request: Request) -> None:
    """No query parameter of this API takes a list (a test keeps the OpenAPI document so): one given twice is
    refused, where FastAPI would keep the last value and answer as if the first had not been sent."""
    counts = Counter(name for name, _ in request.query_params.multi_items())
    repeated = sorted(name for name, n in counts.items() if n > 1)
    if repeated:
        raise RequestValidationError([{"loc": ("query", name), "type": "value_error",
                                       "msg": f"given {counts[name]} times; it takes one value"}
                                      for name in repeated])
