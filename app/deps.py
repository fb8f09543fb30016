"""Dependency aliases: the service container, the request's principal, and a job loaded from its path id (or
a 404, also when the job is another owner's)."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

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
