"""What the routes do, apart from HTTP: accept a job, describe it, cancel it, delete it, check readiness.

Everything here is synchronous (SQLAlchemy and file calls); routes run it in the thread pool, never on the
event loop.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.metrics import Metrics
from app.problems import ProblemError
from app.schemas import JobArtifact, JobError, JobInput, JobLinks, JobOut, JobProgress, JobSummary
from app.settings import Settings
from app.uploads import Upload
from worker.errors import OptionsError
from worker.jobs.files import JobFiles
from worker.jobs.queue import JobQueue
from worker.jobs.store import IdempotencyConflict, Job, JobState, JobStore, NewJob

#: What the API advises clients to wait between polls of a job that has not finished.
RETRY_AFTER_SECONDS = "2"
#: Options the service decides itself, never the client.
SERVER_OPTIONS = {"trusted_external_data": "the service never reads external data named by an upload"}


@dataclass
class Services:
    settings: Settings
    store: JobStore
    files: JobFiles
    queue: JobQueue
    metrics: Metrics

    def close(self) -> None:
        self.queue.close()
        self.store.dispose()


def parse_options(places: str | None, options_text: str | None) -> dict[str, Any]:
    """The job's options as stored: validated with the engine's own checks, places included."""
    from worker.api import OptimizeOptions, validate_options

    options = _options_object(options_text)
    for name, reason in SERVER_OPTIONS.items():
        if name in options:
            raise ProblemError(422, "invalid-option", f"option {name} cannot be set over HTTP: {reason}",
                               field=f"options.{name}")
    if "places" in options:
        raise ProblemError(422, "invalid-option", "give the places in the 'places' form field, not in options",
                           field="options.places")
    if places is not None:
        options["places"] = places
    try:
        parsed = OptimizeOptions.from_dict(options)
        validate_options(parsed)
    except OptionsError as error:
        where = error.field or "options"
        field = where if where in ("places", "options") else f"options.{where}"
        raise ProblemError(422, "invalid-option", str(error), field=field) from None
    return parsed.to_dict()


def _options_object(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ProblemError(422, "invalid-option", f"options is not valid JSON: {error}", field="options") from None
    if not isinstance(value, dict):
        raise ProblemError(422, "invalid-option", "options must be a JSON object", field="options")
    return value


def submit(services: Services, upload: Upload, options: dict[str, Any],
           idempotency_key: str | None) -> tuple[Job, bool]:
    """Store the upload as a new queued job and enqueue it; returns (job, created).

    With an Idempotency-Key already used for the same request, the existing job is returned (created False);
    used for a different request, it is a 422.
    """
    places = options.pop("places")
    fingerprint = _fingerprint(upload.sha256, places, options)
    new = NewJob(input_filename=upload.filename, input_bytes=upload.bytes, input_sha256=upload.sha256,
                 places=places, options=options, max_attempts=services.settings.max_attempts,
                 idempotency_key=idempotency_key, request_fingerprint=fingerprint)
    services.files.adopt_upload(upload.path, new.id)
    try:
        job = services.store.create(new)
    except IdempotencyConflict as conflict:
        services.files.remove_job(new.id)
        if conflict.existing.request_fingerprint != fingerprint:
            raise ProblemError(422, "idempotency-key-reused", "this Idempotency-Key was already used for a "
                               "different request (another model, places or options)", field="Idempotency-Key",
                               job_id=conflict.existing.id) from None
        return conflict.existing, False
    except BaseException:
        services.files.remove_job(new.id)
        raise
    try:
        services.queue.enqueue(job.id)
    except Exception as error:
        services.store.delete(job.id)
        services.files.remove_job(job.id)
        raise ProblemError(503, "queue-unavailable", f"the job queue is unavailable ({type(error).__name__}); "
                           "nothing was kept, try again later", headers={"Retry-After": "10"}) from None
    services.metrics.jobs_submitted.inc()
    services.metrics.upload_bytes.inc(upload.bytes)
    return job, True


def _fingerprint(sha256: str, places: str, options: dict[str, Any]) -> str:
    text = json.dumps({"sha256": sha256, "places": places, "options": options}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def cancel(services: Services, job: Job) -> Job:
    if job.state.is_terminal:
        raise ProblemError(409, "job-finished", f"the job is already {job.state.value}; there is nothing to cancel",
                           job_id=job.id, job_status=job.state.value)
    updated = services.store.request_cancel(job.id)
    if updated is None:
        raise ProblemError(404, "job-not-found", f"there is no job {job.id!r}", field="job_id")
    return updated


def delete(services: Services, job: Job) -> None:
    if not services.store.delete(job.id, unless_state=[JobState.RUNNING]):
        if services.store.get(job.id) is None:
            return
        raise ProblemError(409, "job-running", "the job is running; cancel it first and delete it once it has "
                           "stopped", job_id=job.id)
    services.files.remove_job(job.id)


def job_out(job: Job) -> JobOut:
    base = f"/jobs/{job.id}"
    progress = None
    if job.progress_total:
        progress = JobProgress(current_pass=job.progress_pass or "", index=job.progress_index or 0,
                               total=job.progress_total)
    artifact = None
    if job.state is JobState.SUCCEEDED and job.artifact_sha256:
        external = bool((job.summary or {}).get("external_data"))
        artifact = JobArtifact(bytes=job.artifact_bytes or 0, sha256=job.artifact_sha256, url=f"{base}/artifact",
                               data_url=f"{base}/artifact/data" if external else None)
    error = JobError(type=job.error_type, message=job.error_message or "",
                     field=job.error_field) if job.error_type else None
    return JobOut(
        id=job.id, status=job.state.value, created_at=job.created_at, updated_at=job.updated_at,
        started_at=job.started_at, finished_at=job.finished_at, attempt=job.attempt,
        max_attempts=job.max_attempts, cancel_requested=job.cancel_requested, progress=progress,
        places=job.places, options=job.options,
        input=JobInput(filename=job.input_filename, bytes=job.input_bytes, sha256=job.input_sha256),
        artifact=artifact, error=error, retry_reason=job.retry_reason,
        summary=JobSummary(**job.summary) if job.summary else None,
        links=JobLinks(self=base, artifact=f"{base}/artifact", trace=f"{base}/trace", memory=f"{base}/memory",
                       report=f"{base}/report", cancel=f"{base}/cancel"))


def artifact_file(services: Services, job: Job) -> Path:
    _require_succeeded(job, "artifact")
    path = services.files.artifact_path(job.id, job.artifact_attempt)
    if not path.is_file():
        raise ProblemError(404, "artifact-missing", "the job's artifact is missing from storage", job_id=job.id)
    return path


def artifact_data_file(services: Services, job: Job) -> Path:
    _require_succeeded(job, "artifact")
    path = services.files.artifact_data_path(job.id, job.artifact_attempt)
    if not path.is_file():
        raise ProblemError(404, "no-external-data", "the job's model keeps its weights inside the model file; "
                                                    "it has no external data", job_id=job.id)
    return path


def report(services: Services, job: Job) -> dict[str, Any]:
    """The published report, with server paths reduced to file names."""
    _require_succeeded(job, "report")
    path = services.files.report_path(job.id, job.artifact_attempt)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ProblemError(404, "report-missing", "the job's report is missing from storage",
                           job_id=job.id) from None
    for side in (data.get("model") or {}).values():
        if isinstance(side, dict) and isinstance(side.get("path"), str):
            side["path"] = Path(side["path"]).name
    return data


def _require_succeeded(job: Job, what: str) -> None:
    if job.state is not JobState.SUCCEEDED:
        raise ProblemError(409, "job-not-succeeded", f"the job is {job.state.value}; it has an {what} only once "
                           "it has succeeded", job_id=job.id, job_status=job.state.value)


def readiness(services: Services) -> dict[str, dict[str, Any]]:
    return {
        "database": _check(services.store.ping, "the job table answers"),
        "storage": _check(lambda: _probe_storage(services.files.root), "the data directory is writable"),
        "queue": _check(services.queue.ping, f"the {services.queue.backend} queue answers"),
        "worker": _worker_check(services),
    }


def _worker_check(services: Services) -> dict[str, Any]:
    window = services.settings.lease_seconds
    try:
        workers = services.store.live_workers(window)
    except Exception as error:  # noqa: BLE001 - the database check says more
        return {"ok": False, "detail": f"cannot read worker heartbeats ({type(error).__name__})"}
    if not workers:
        return {"ok": False, "detail": f"no worker sent a heartbeat in the last {window:g} s"}
    return {"ok": True, "detail": f"{len(workers)} worker(s) sent a heartbeat in the last {window:g} s"}


def _check(probe, ok_detail: str) -> dict[str, Any]:
    try:
        probe()
    except Exception as error:  # noqa: BLE001 - any failure means "not ready", and says why
        return {"ok": False, "detail": f"{type(error).__name__}: {error}"[:300]}
    return {"ok": True, "detail": ok_detail}


def _probe_storage(root: Path) -> None:
    probe = root / f".ready-{secrets.token_hex(4)}"
    probe.write_bytes(b"ok")
    probe.unlink()
