"""What the routes do, apart from HTTP: accept a job, describe it, cancel it, delete it, check readiness.

Everything here is synchronous (SQLAlchemy and file calls); routes run it in the thread pool, never on the
event loop. Failures are ``app.errors`` exceptions, which ``app.problems`` answers.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from app.downloads import Reader, TarMember, TarOfFiles
from app.errors import Conflict, InvalidRequest, NotFound, Unavailable
from app.metrics import Metrics
from app.quotas import UploadRate, check_active_jobs, check_stored_bytes
from app.schemas import JobArtifact, JobError, JobInput, JobLinks, JobOut, JobProgress, JobSummary
from app.settings import Settings
from app.uploads import Upload
from worker.engine.api import OptionsError, memory_at
from worker.jobs import (ArchiveError, CallbackRefused, CallbackStore, IdempotencyConflict, Job, JobFiles, JobQueue,
                         JobSpec, JobState, JobStore, KeyStore, NewJob, ObjectWriter, Report, artifact_name, cache_key,
                         check_callback_url, check_upload, engine_identity, reuse_result)

if TYPE_CHECKING:
    from app.auth import Principal

#: What the API advises clients to wait between polls of a job that has not finished.
RETRY_AFTER_SECONDS = "2"
#: What the API advises a client refused because the queue is full to wait before submitting again.
QUEUE_FULL_RETRY_SECONDS = 10
#: How long a presigned download URL stays valid.
PRESIGN_SECONDS = 300
REPORT_LIMIT = 64 << 20
DOWNLOAD_CHUNK = 1 << 20


@dataclass
class Services:
    settings: Settings
    store: JobStore
    files: JobFiles
    queue: JobQueue
    metrics: Metrics

    @cached_property
    def keys(self) -> KeyStore:
        return KeyStore(self.store)

    @cached_property
    def oidc(self):
        """The identity provider's token checker (app.oidc), or None when none is configured."""
        if not self.settings.oidc_issuer:
            return None
        from app.oidc import OidcVerifier

        return OidcVerifier(self.settings)

    @cached_property
    def upload_rate(self) -> UploadRate:
        return UploadRate(self.settings.quota_uploads_per_minute)

    def close(self) -> None:
        self.queue.close()
        self.store.dispose()
        self.files.storage.close()


@dataclass
class Download:
    """How to hand a stored file to a client: any byte range of it (from its local file or the store), or a
    redirect to the store."""

    filename: str
    size: int | None = None
    path: Path | None = None
    #: ``read(start, end)``: the bytes [start, end) of an object streamed from the store.
    read: Reader | None = None
    redirect: str | None = None


def parse_spec(fields: Mapping[str, str]) -> JobSpec:
    """The job spec of a submission's ``places`` and ``options`` form fields, checked by the engine's rules."""
    options = _options_object(fields.get("options"))
    if "places" in options:
        raise InvalidRequest("invalid-option", "give the places in the 'places' form field, not in options",
                             field="options.places")
    try:
        return JobSpec.validate(fields.get("places"), options)
    except OptionsError as error:
        where = error.field or "options"
        field = where if where in ("places", "options") else f"options.{where}"
        raise InvalidRequest("invalid-option", str(error), field=field) from None


def _options_object(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidRequest("invalid-option", f"options is not valid JSON: {error}", field="options") from None
    if not isinstance(value, dict):
        raise InvalidRequest("invalid-option", "options must be a JSON object", field="options")
    return value


def get_job(services: Services, job_id: str, viewer: Principal | None = None) -> Job:
    """The job, if ``viewer`` may see it: another owner's job is as missing as one that does not exist."""
    job = services.store.get(job_id)
    if job is None or (viewer is not None and not viewer.may_see(job)):
        raise NotFound("job-not-found", f"there is no job {job_id!r}", field="job_id")
    return job


def check_capacity(services: Services) -> None:
    """Refuse a submission while ``MIRSERVE_MAX_QUEUED`` jobs wait for a worker (before its upload is read).

    Submissions accepted at the same moment may each see room, so the queue can pass the limit by the few
    submissions in flight; it stops growing all the same.
    """
    limit = services.settings.max_queued
    if not limit:
        return
    queued = services.store.count_queued()
    if queued >= limit:
        raise Unavailable("queue-full", f"{queued} jobs are waiting for a worker, the most this service queues "
                          f"(MIRSERVE_MAX_QUEUED={limit}); nothing was kept, submit again later",
                          retry_after=QUEUE_FULL_RETRY_SECONDS, queued=queued, max_queued=limit)


def input_writer(services: Services, job_id: str) -> ObjectWriter:
    """Where a submission's model goes as it arrives: the job's input in the store."""
    return services.files.storage.writer(services.files.input_key(job_id))


def discard_input(services: Services, job_id: str) -> None:
    """Throw away what a submission that was not accepted stored."""
    services.files.remove_job(job_id)


def parse_callback(fields: Mapping[str, str], settings: Settings) -> str | None:
    """The submission's ``callback_url`` field, if the deployment may call it back."""
    url = (fields.get("callback_url") or "").strip()
    if not url:
        return None
    try:
        return check_callback_url(url, settings.callback_hosts)
    except CallbackRefused as refusal:
        raise InvalidRequest("callback-refused", str(refusal), field="callback_url") from None


def admit_submission(services: Services, principal: Principal) -> None:
    """The quotas a submission must be within before its body is read (app.quotas); admins have none."""
    if principal.is_admin:
        return
    services.upload_rate.admit(principal.owner)
    usage = services.store.usage(principal.owner)
    check_active_jobs(principal.owner, usage.active_jobs, services.settings.quota_active_jobs)
    check_stored_bytes(principal.owner, usage.stored_bytes, 0, services.settings.quota_stored_bytes)


def submit(services: Services, job_id: str, upload: Upload, spec: JobSpec, idempotency_key: str | None,
           callback_url: str | None = None, principal: Principal | None = None) -> tuple[Job, bool]:
    """Make the stored upload a new queued job and enqueue it; returns (job, created).

    With an Idempotency-Key already used for the same request, the existing job is returned (created False);
    used for a different request, it is a 422. Whatever is not accepted is removed from the store. Idempotency
    keys are each owner's own: two owners using the same key never meet. A request an earlier job of the same
    owner already answered (``worker.jobs.result_cache``) is a job succeeded at once, never queued.
    """
    owner = principal.owner if principal is not None else None
    try:
        check_archive(services, job_id)
        if principal is not None and not principal.is_admin:  # now that the upload's size is known
            check_stored_bytes(owner, services.store.usage(owner).stored_bytes, upload.bytes,
                               services.settings.quota_stored_bytes)
    except BaseException:
        services.files.remove_job(job_id)
        raise
    fingerprint = spec.fingerprint(upload.sha256)
    new = NewJob(id=job_id, input_filename=upload.filename, input_bytes=upload.bytes, input_sha256=upload.sha256,
                 spec=spec, max_attempts=services.settings.max_attempts,
                 idempotency_key=_owned_key(owner, idempotency_key), request_fingerprint=fingerprint, owner=owner)
    try:
        source = _cached_result(services, new)
        job = services.store.create(new, cached=source)
    except IdempotencyConflict as conflict:
        services.files.remove_job(new.id)
        if conflict.existing.request_fingerprint != fingerprint:
            raise InvalidRequest("idempotency-key-reused", "this Idempotency-Key was already used for a different "
                                 "request (another model, places or options)", field="Idempotency-Key",
                                 job_id=conflict.existing.id) from None
        return conflict.existing, False
    except BaseException:
        services.files.remove_job(new.id)
        raise
    try:
        if callback_url is not None:  # before the queue hears of it: the job cannot end without its callback
            CallbackStore(services.store).add(job.id, callback_url)
        if source is None:
            services.queue.enqueue(job.id)
    except Exception as error:
        services.store.delete(job.id)
        services.files.remove_job(job.id)
        raise Unavailable("queue-unavailable", f"the job queue is unavailable ({type(error).__name__}); "
                          "nothing was kept, try again later", retry_after=10) from None
    services.metrics.jobs_submitted.inc()
    services.metrics.upload_bytes.inc(upload.bytes)
    return job, True


def _cached_result(services: Services, new: NewJob) -> Job | None:
    """The succeeded job of the same owner whose result the new job reuses, with its outputs already copied to
    the new job's; None when caching is off for the job or the deployment, or no such result (still) exists.
    Owners never share results: a hit would tell one that another submitted the same model."""
    if not (services.settings.cache and new.spec.cache):
        return None
    try:
        key = cache_key(new.input_sha256, new.spec, engine_identity())
    except Exception:  # noqa: BLE001 - an engine that cannot tell what it is runs the job instead
        return None
    source = services.store.find_cached(key, owner=new.owner)
    if source is None or source.artifact_attempt is None:
        return None
    if not reuse_result(services.files, source.id, source.artifact_attempt, new.id):
        return None  # deleted meanwhile: the job runs
    return source


def _owned_key(owner: str | None, key: str | None) -> str | None:
    """The Idempotency-Key as stored: the owner's namespace (a digest, to stay within the column) or, without
    owners, the key itself."""
    if key is None or owner is None:
        return key
    return hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()


def check_archive(services: Services, job_id: str) -> None:
    """Refuse an archive upload whose members are not a model and its data files (a 422 naming the member).

    Only the member list is read (a zip's central directory, a tar's headers), never the model. With an S3 store
    the API keeps no local copy: the engine process checks the same list before it unpacks, and a refusal
    fails the job with the same message.
    """
    local = services.files.storage.local_path(services.files.input_key(job_id))
    if local is None:
        return
    try:
        check_upload(local, services.settings.archive_limits)
    except ArchiveError as error:
        raise InvalidRequest("invalid-archive", str(error), field="model", member=error.member) from None


def callback(services: Services, job: Job) -> dict[str, Any]:
    found = CallbackStore(services.store).get(job.id)
    if found is None:
        raise NotFound("no-callback", "the job was submitted without a callback_url", job_id=job.id)
    if found["state"] != "pending":
        found["next_at"] = None
    return found


def cancel(services: Services, job: Job) -> Job:
    if job.state.is_terminal:
        raise Conflict("job-finished", f"the job is already {job.state.value}; there is nothing to cancel",
                       job_id=job.id, job_status=job.state.value)
    updated = services.store.request_cancel(job.id)
    if updated is None:
        raise NotFound("job-not-found", f"there is no job {job.id!r}", field="job_id")
    return updated


def delete(services: Services, job: Job) -> None:
    if not services.store.delete(job.id, unless_state=[JobState.RUNNING]):
        if services.store.get(job.id) is None:
            return
        raise Conflict("job-running", "the job is running; cancel it first and delete it once it has stopped",
                       job_id=job.id)
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
                               data_url=f"{base}/artifact/data" if external else None,
                               archive_url=f"{base}/artifact/archive")
    error = JobError(type=job.error_type, message=job.error_message or "",
                     field=job.error_field) if job.error_type else None
    return JobOut(
        id=job.id, status=job.state.value, created_at=job.created_at, updated_at=job.updated_at,
        started_at=job.started_at, finished_at=job.finished_at, attempt=job.attempt,
        max_attempts=job.max_attempts, cancel_requested=job.cancel_requested, progress=progress,
        places=job.spec.places, options=dict(job.spec.options),
        input=JobInput(filename=job.input_filename, bytes=job.input_bytes, sha256=job.input_sha256),
        artifact=artifact, error=error, retry_reason=job.retry_reason,
        summary=JobSummary(**job.summary) if job.summary else None,
        cached=job.cached_from is not None, cached_from=job.cached_from,
        links=JobLinks(self=base, artifact=f"{base}/artifact", trace=f"{base}/trace", memory=f"{base}/memory",
                       report=f"{base}/report", cancel=f"{base}/cancel"))


def artifact(services: Services, job: Job, *, data: bool = False) -> Download:
    """The optimized model (``data``: its external weights), as the store can hand it out."""
    _require_succeeded(job, "artifact")
    files, storage = services.files, services.files.storage
    key = (files.artifact_data_key if data else files.artifact_key)(job.id, job.artifact_attempt)
    filename = "model.onnx.data" if data else artifact_name(job.input_filename)
    try:
        local = storage.local_path(key)
        if local is None and services.settings.storage_redirect and storage.exists(key):
            return Download(filename, redirect=storage.presign(key, filename, PRESIGN_SECONDS))
        size, read = _stored_reader(storage, key)
        return Download(filename, size, path=local, read=read)
    except FileNotFoundError:  # ObjectMissing included
        if data:
            raise NotFound("no-external-data", "the job's model keeps its weights inside the model file; it has "
                           "no external data", job_id=job.id) from None
        raise NotFound("artifact-missing", "the job's artifact is missing from storage", job_id=job.id) from None


def artifact_archive(services: Services, job: Job) -> tuple[TarOfFiles, str]:
    """The optimized model and its external data (when it has some) as one tar, and the tar's file name: the
    members keep the names the model refers to, so unpacking it gives a model that loads."""
    _require_succeeded(job, "artifact")
    files, storage = services.files, services.files.storage
    model_key = files.artifact_key(job.id, job.artifact_attempt)
    data_key = files.artifact_data_key(job.id, job.artifact_attempt)
    name = artifact_name(job.input_filename)
    try:
        members = [_tar_member(storage, model_key, name)]
        if storage.exists(data_key):
            members.append(_tar_member(storage, data_key, "model.onnx.data"))
    except FileNotFoundError:  # ObjectMissing included
        raise NotFound("artifact-missing", "the job's artifact is missing from storage", job_id=job.id) from None
    finished = int(job.finished_at.timestamp()) if job.finished_at else 0
    return TarOfFiles(members, mtime=finished), name.removesuffix(".onnx") + ".tar"


def _tar_member(storage, key: str, name: str) -> TarMember:
    size, read = _stored_reader(storage, key)
    return TarMember(name, size, lambda offset: read(offset, size))


def _stored_reader(storage, key: str) -> tuple[int, Reader]:
    """An object's size and a reader of any range of it: from its file, or from the store by ranged reads."""
    local = storage.local_path(key)
    if local is not None:
        return local.stat().st_size, lambda start, end: _bounded(_file_chunks(local, start), end - start)
    opened = [storage.open(key)]  # its size now; its stream serves a read from the start

    def read(start: int, end: int) -> Iterator[bytes]:
        found = opened.pop() if opened and start == 0 else storage.open(key, start)
        return _bounded(found.chunks, end - start)
    return opened[0].size, read


def _bounded(chunks: Iterator[bytes], length: int) -> Iterator[bytes]:
    for chunk in chunks:
        if len(chunk) >= length:
            if length:
                yield chunk[:length]
            return
        yield chunk
        length -= len(chunk)


def _file_chunks(path: Path, offset: int) -> Iterator[bytes]:
    with open(path, "rb") as stream:
        stream.seek(offset)
        while chunk := stream.read(DOWNLOAD_CHUNK):
            yield chunk


def report(services: Services, job: Job) -> Report:
    """The published report (it names no server path: the runner published it so)."""
    _require_succeeded(job, "report")
    try:
        return Report.from_json(services.files.storage.read_bytes(
            services.files.report_key(job.id, job.artifact_attempt), REPORT_LIMIT))
    except (OSError, ValueError):
        raise NotFound("report-missing", "the job's report is missing from storage", job_id=job.id) from None


def memory(services: Services, job: Job, dims: str | None = None) -> dict[str, Any]:
    found = report(services, job).memory
    if found is None:
        raise NotFound("no-memory-report", "this job's report has no memory estimates (the memory planning pass "
                       "did not run)", job_id=job.id)
    if dims is None:
        return found
    try:
        return memory_at(found, dims)
    except OptionsError as error:
        raise InvalidRequest("invalid-dims", str(error), field="dims") from None


def _require_succeeded(job: Job, what: str) -> None:
    if job.state is not JobState.SUCCEEDED:
        raise Conflict("job-not-succeeded", f"the job is {job.state.value}; it has an {what} only once it has "
                       "succeeded", job_id=job.id, job_status=job.state.value)


def readiness(services: Services) -> dict[str, dict[str, Any]]:
    return {
        "database": _check(services.store.ping, "the job table answers"),
        "storage": _check(services.files.storage.ping, "the data directory is writable"
                          if services.files.storage.kind == "local" else "the S3 bucket answers"),
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
