"""``/jobs``: list, read, download, cancel and delete jobs."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, StreamingResponse

from app import pictures
from app import services as jobs
from app.auth import PrincipalDep
from app.deps import JobDep, ServicesDep
from app.downloads import attachment, ranged
from app.problems import problem_responses
from app.schemas import CallbackOut, JobOut, JobPage, JobStatus, TraceEntry
from worker.jobs import JobState

router = APIRouter(prefix="/jobs", tags=["jobs"])
ONNX_MEDIA_TYPE = "application/octet-stream"
MAX_OFFSET = 1_000_000_000  # keeps OFFSET within the databases' 64-bit integers


@router.get("", response_model=JobPage, responses=problem_responses(422))
def list_jobs(services: ServicesDep, principal: PrincipalDep, status: JobStatus | None = None,
              limit: Annotated[int, Query(ge=1, le=100)] = 20,
              offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0):
    """Your jobs (an admin's: everyone's), newest first, optionally only those with one status."""
    found, total = services.store.list(state=JobState(status) if status else None, limit=limit, offset=offset,
                                       owner=principal.owner_filter)
    next_offset = offset + len(found) if offset + len(found) < total else None
    return JobPage(items=[jobs.job_out(j) for j in found], total=total, limit=limit, offset=offset,
                   next_offset=next_offset)


@router.get("/{job_id}", response_model=JobOut, responses=problem_responses(404))
async def get_job(job: JobDep, response: Response):  # the job is loaded in the thread pool by JobDep
    """The job's status, progress (current pass, i of n), attempt, timestamps, error and summary."""
    if not job.state.is_terminal:
        response.headers["Retry-After"] = jobs.RETRY_AFTER_SECONDS
    return jobs.job_out(job)


PARTIAL_RESPONSE = {206: {"description": "The byte range asked for with Range (Content-Range says which).",
                          "headers": {"Content-Range": {"schema": {"type": "string"}}}}}
RangeHeader = Annotated[str | None, Header(alias="Range", description="bytes=START- (or START-END, -N) to "
                                                                         "resume a download")]
IfRangeHeader = Annotated[str | None, Header(alias="If-Range", description="the ETag the part already "
                                                                             "downloaded had: a Range is served "
                                                                             "only if it still matches")]
REDIRECT_RESPONSE = {307: {"description": "With MIRSERVE_STORAGE_REDIRECT=1 and an S3 store: download from the "
                                          "presigned URL in Location (valid for a few minutes).",
                           "headers": {"Location": {"schema": {"type": "string"}}}}}


@router.get("/{job_id}/artifact", response_class=FileResponse,
            responses={200: {"content": {ONNX_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                             "description": "The optimized model.",
                             "headers": {"ETag": {"schema": {"type": "string"}}}},
                       304: {"description": "Not modified: the artifact still has the ETag given in If-None-Match."},
                       **PARTIAL_RESPONSE, **REDIRECT_RESPONSE, **problem_responses(404, 409, 416)})
def get_artifact(job: JobDep, services: ServicesDep,
                 if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
                 range_: RangeHeader = None, if_range: IfRangeHeader = None):
    """The optimized model, with a strong ETag (its sha256); 409 until the job has succeeded. Resumable with
    `Range` (and `If-Range` on the ETag)."""
    etag = f'"{job.artifact_sha256}"'
    if job.state is JobState.SUCCEEDED and if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    return _send(jobs.artifact(services, job), etag, range_, if_range)


@router.get("/{job_id}/artifact/data", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                             "description": "The external weights of a model over 2 GB."},
                       **PARTIAL_RESPONSE, **REDIRECT_RESPONSE, **problem_responses(404, 409, 416)})
def get_artifact_data(job: JobDep, services: ServicesDep, range_: RangeHeader = None,
                      if_range: IfRangeHeader = None):
    """The weights of a model too big for one protobuf (over 2 GB), which the model names as
    `model.onnx.data`: save this file under that name beside the downloaded model. 404 when the model keeps
    its weights inside. Resumable with `Range` (its ETag is the model's sha256 with `.data`)."""
    return _send(jobs.artifact(services, job, data=True), f'"{job.artifact_sha256}.data"', range_, if_range)


@router.get("/{job_id}/artifact/archive", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
                             "description": "The optimized model and its external data as one tar.",
                             "headers": {"ETag": {"schema": {"type": "string"}},
                                         "Accept-Ranges": {"schema": {"type": "string"}}}},
                       **PARTIAL_RESPONSE, **problem_responses(404, 409, 416)})
def get_artifact_archive(job: JobDep, services: ServicesDep, range_: RangeHeader = None,
                         if_range: IfRangeHeader = None):
    """The optimized model with its external data (when it has some) as one uncompressed tar whose members
    keep the names the model refers to; resumable with `Range` (and `If-Range` on its ETag)."""
    archive, filename = jobs.artifact_archive(services, job)
    return ranged(archive.size, archive.read, f'"{job.artifact_sha256}.tar"', filename, "application/x-tar",
                  range_, if_range)


def _send(download: jobs.Download, etag: str, range_: str | None, if_range: str | None) -> Response:
    """The file, or the one byte range asked for, or a redirect to the store (which answers Range itself)."""
    if download.redirect is not None:
        return RedirectResponse(download.redirect, status_code=307, headers={"ETag": etag})
    return ranged(download.size, download.read, etag, download.filename, ONNX_MEDIA_TYPE, range_, if_range)


def _matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 If-None-Match: weak comparison over a list of tags, or '*'."""
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


@router.get("/{job_id}/trace", response_model=list[TraceEntry], response_model_exclude_unset=True,
            responses={200: {"content": {"application/json": {"schema": {"oneOf": [
                {"type": "array", "items": {"$ref": "#/components/schemas/TraceEntry"}},
                {"type": "object", "description": "format=chrome: a Chrome trace-event document"}]}}}},
                       **problem_responses(404, 409, 422)})
def get_trace(job: JobDep, services: ServicesDep,
              format: Annotated[Literal["entries", "chrome"], Query(
                  description="entries (default), or chrome: the Chrome trace-event format that Perfetto and "
                              "chrome://tracing open, one slice per pass with its rewrites as args")] = "entries"
              ) -> Any:
    """Per pass: kind, origin, seconds, skip reason, node and value counts before and after, rewrites."""
    if format == "chrome":
        return JSONResponse(pictures.chrome_trace(services, job))
    return jobs.report(services, job).trace


@router.get("/{job_id}/memory", response_model=dict[str, Any], responses=problem_responses(404, 409, 422))
def get_memory(job: JobDep, services: ServicesDep, dims: Annotated[str | None, Query(
        description="sizes of the model's open input dims, e.g. batch=8,seq=512: the arena, peak and io bytes "
                    "there, from the formulas the memory plan fitted", examples=["batch=8,seq=512"])] = None) -> Any:
    """The memory estimates of the optimized model (the memory planning pass's report), or at ``dims``."""
    return jobs.memory(services, job, dims)


@router.get("/{job_id}/report", response_model=dict[str, Any], responses=problem_responses(404, 409))
def get_report(job: JobDep, services: ServicesDep) -> Any:
    """The engine's whole report: model sizes, places, options, trace, verification, memory, kernels."""
    return jobs.report(services, job).to_dict()


@router.get("/{job_id}/callback", response_model=CallbackOut, responses=problem_responses(404))
def get_callback(job: JobDep, services: ServicesDep):
    """Where the job's end is notified and how that went: pending, delivered, or failed with the last error."""
    return jobs.callback(services, job)


@router.post("/{job_id}/cancel", status_code=202, response_model=JobOut, responses=problem_responses(404, 409))
def cancel_job(job: JobDep, services: ServicesDep):
    """Cancel a queued job at once, or ask the worker to stop a running one (its engine process is killed)."""
    return jobs.job_out(jobs.cancel(services, job))


@router.delete("/{job_id}", status_code=204, response_class=Response, responses=problem_responses(404, 409))
def delete_job(job: JobDep, services: ServicesDep):
    """Delete a job that is not running, with its upload and artifact."""
    jobs.delete(services, job)
    return Response(status_code=204)
