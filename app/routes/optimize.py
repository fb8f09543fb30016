"""``POST /optimize``: accept a model and its places, answer 202 with the queued job."""
from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Request, Response

from app import services as jobs
from app.auth import PrincipalDep
from app.deps import ServicesDep
from app.errors import ServiceError
from app.problems import problem_responses
from app.schemas import JobOut
from app.uploads import receive_upload
from worker.jobs import new_job_id

router = APIRouter(tags=["jobs"])
SUBMIT_THREADS = 4

FORM_SCHEMA = {
    "required": True,
    "content": {"multipart/form-data": {"schema": {
        "type": "object",
        "required": ["model"],
        "properties": {
            "model": {"type": "string", "format": "binary",
                      "description": "the ONNX model file, or a .zip, .tar or .tar.gz holding one .onnx model "
                                     "and the files its external data names"},
            "places": {"type": "string", "example": "arm/fp16/nhwc,arm/fp32/nchw",
                       "description": "valid places in priority order, each target/precision/layout "
                                      "(default x86/fp32/nchw)"},
            "callback_url": {"type": "string", "format": "uri", "maxLength": 2048,
                             "description": "POSTed a signed JSON notice when the job ends (HMAC-SHA256 in "
                                            "X-Mirserve-Signature); its host must be in MIRSERVE_CALLBACK_ALLOW"},
            "options": {"type": "string", "example": '{"input_shapes": {"x": [1, 3, 640, 640]}}',
                        "description": "JSON object of engine options: input_shapes, opt_level, "
                                       "disabled_passes, pipeline, portable, fp16_storage, host_fallback, "
                                       "check_support_only, verify, allow_unverified, precision_fallback, verify_runs, "
                                       "rtol, atol, "
                                       "dim_bounds, cut_start, cut_end, target_opset, strict; and cache (default "
                                       "true: reuse the result of an earlier job with the same model, places, "
                                       "options and engine; false: run anyway)"},
        },
    }}},
}


def _submit_limiter(request: Request) -> anyio.CapacityLimiter:
    """Submissions get their own few threads: the job table takes one writer at a time anyway, and a burst of
    uploads must not occupy the whole thread pool that reads such as GET /jobs/{id} need."""
    limiter = getattr(request.app.state, "submit_limiter", None)
    if limiter is None:
        limiter = request.app.state.submit_limiter = anyio.CapacityLimiter(SUBMIT_THREADS)
    return limiter


@router.post("/optimize", status_code=202, response_model=JobOut, openapi_extra={"requestBody": FORM_SCHEMA},
             responses={**problem_responses(400, 413, 415, 422, 429, 503),
                        202: {"headers": {"Location": {"schema": {"type": "string"}},
                                          "Retry-After": {"schema": {"type": "string"}}}}})
async def optimize(request: Request, response: Response, services: ServicesDep, principal: PrincipalDep,
                   idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1,
                                                                 max_length=255, pattern=r"^[\x21-\x7e]+$")] = None):
    """Upload a model with its places and options; the job is validated, stored and queued."""
    await anyio.to_thread.run_sync(jobs.admit_submission, services, principal)  # 429 before the body is read
    if services.settings.max_queued:
        await anyio.to_thread.run_sync(jobs.check_capacity, services, limiter=_submit_limiter(request))
    job_id = new_job_id()
    upload = await receive_upload(request.headers.get("content-type"), request.headers.get("content-length"),
                                  request.stream(), jobs.input_writer(services, job_id),
                                  services.settings.max_upload_bytes, check_fields=jobs.parse_spec)
    try:  # pure checks without I/O, a fraction of a millisecond: no thread hop for them
        spec = upload.checked or jobs.parse_spec(upload.fields)
        callback = jobs.parse_callback(upload.fields, services.settings)
    except ServiceError:
        await anyio.to_thread.run_sync(jobs.discard_input, services, job_id)
        raise
    job, _created = await anyio.to_thread.run_sync(jobs.submit, services, job_id, upload, spec, idempotency_key,
                                                   callback, principal, limiter=_submit_limiter(request))
    response.headers["Location"] = f"/jobs/{job.id}"
    response.headers["Retry-After"] = jobs.RETRY_AFTER_SECONDS
    return jobs.job_out(job)
