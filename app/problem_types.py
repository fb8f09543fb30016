"""Every kind of problem the service answers, explained: ``/problems/<slug>`` (a problem document's ``type``)
resolves to a page built from this table, so a client that meets a problem can read what it means and what to
do. A test checks that every slug the code can raise is here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProblemType:
    status: int
    title: str
    explanation: str
    remedy: str


PROBLEM_TYPES: dict[str, ProblemType] = {
    "unauthorized": ProblemType(
        401, "Unauthorized",
        "The request has no API key, or its key is unknown, expired or revoked. Every route but the health "
        "checks needs `Authorization: Bearer <key>` where the service uses keys (MIRSERVE_AUTH=keys).",
        "Send your key as a bearer token (the client and the remote commands take MIRSERVE_TOKEN or --token); "
        "the operator makes keys with `mirserve keys create`."),
    "quota-exceeded": ProblemType(
        429, "Quota exceeded",
        "A limit of your account is reached; `limit` names it: `active_jobs` (jobs queued or running), "
        "`stored_bytes` (uploads and artifacts your jobs keep) or `uploads_per_minute`. `maximum` is the limit "
        "and `current` where you are. Nothing of the refused submission was kept.",
        "Wait for Retry-After seconds; for `stored_bytes`, delete jobs you no longer need."),
    "invalid-option": ProblemType(
        422, "Invalid option",
        "A place or an engine option of the submission is malformed or names something that does not exist: a "
        "target, precision or layout, a pass, a pipeline, an input of the model. `field` names it "
        "(`places`, `options.opt_level`, ...) and `detail` says what is allowed.",
        "Fix the field; `GET /passes` and `GET /targets` list what exists."),
    "invalid-request": ProblemType(
        422, "Invalid request",
        "A query parameter, header or form field does not have the expected form (a limit out of range, an "
        "unknown status, an Idempotency-Key with spaces). `errors` lists every invalid field.",
        "Send the field as the OpenAPI document (`/docs`) describes it."),
    "invalid-dims": ProblemType(
        422, "Invalid dims",
        "`GET /jobs/{id}/memory?dims=...` names a dimension the memory plan does not have open, gives a value "
        "that is not a positive integer, or is not written `NAME=N,NAME=N`.",
        "Use the open dims the memory report lists (its formulas name them), e.g. `dims=batch=8,seq=512`."),
    "idempotency-key-reused": ProblemType(
        422, "Idempotency key reused",
        "The Idempotency-Key was already used for a different submission (another model, other places or "
        "options). The same key with the same request answers the original job instead.",
        "Use a new key for every distinct submission; `job_id` names the job the key belongs to."),
    "callback-refused": ProblemType(
        422, "Callback refused",
        "The `callback_url` is not an http(s) URL, carries credentials, or names a host this deployment does "
        "not call back (MIRSERVE_CALLBACK_ALLOW lists the hosts; empty, it calls back none).",
        "Use a URL on an allowed host, or ask the operator to allow yours."),
    "no-callback": ProblemType(
        404, "No callback",
        "The job was submitted without a `callback_url`, so there is no notification to report on.",
        "Submit with `callback_url` to be notified when a job ends."),
    "invalid-archive": ProblemType(
        422, "Invalid archive",
        "The upload is a .zip or .tar (optionally gzip) archive that is not one ONNX model with its external data "
        "files: a member with an absolute path, a `..`, a link, a device or FIFO, a name given twice, an "
        "encrypted member, too many members, more unpacked bytes than MIRSERVE_MAX_UNPACKED_MB, a member that "
        "would expand more than 100 times (a compression bomb), or not exactly one `.onnx` member. `member` "
        "names the member at fault; nothing was kept.",
        "Pack the model and the files its external data names, side by side, as plain files."),
    "range-not-satisfiable": ProblemType(
        416, "Range not satisfiable",
        "The `Range` header of a download starts at or beyond the end of the file; `Content-Range: bytes */N` "
        "gives its size. A resumed download whose part is already whole, or belongs to another file, gets this.",
        "Start the download again without `Range` (or from a byte below the size)."),
    "malformed-body": ProblemType(
        400, "Malformed body",
        "The multipart form could not be read: a broken boundary, a part without a name, a field that is not "
        "UTF-8, or no `model` part.",
        "Send `multipart/form-data` with the fields `places`, `options` and the file `model`."),
    "upload-interrupted": ProblemType(
        400, "Upload interrupted",
        "The connection closed before the whole model arrived; nothing was kept.",
        "Submit again (with the same Idempotency-Key, it cannot make a second job)."),
    "upload-too-large": ProblemType(
        413, "Upload too large",
        "The model is larger than the service accepts (MIRSERVE_MAX_UPLOAD_MB); the upload was stopped as soon "
        "as it passed the limit and nothing was kept.",
        "Ask the operator to raise the limit, or cut the model (`cut_start`/`cut_end`) before uploading."),
    "field-too-large": ProblemType(
        413, "Field too large",
        "A form field other than the model (places or options) is larger than a field may be.",
        "Send shorter places and options."),
    "unsupported-media-type": ProblemType(
        415, "Unsupported media type",
        "`POST /optimize` takes `multipart/form-data` only.",
        "Send the model as a form upload (`curl -F model=@file.onnx`)."),
    "job-not-found": ProblemType(
        404, "Job not found",
        "There is no job with this id: it never existed, was deleted, or was removed after the retention time "
        "(MIRSERVE_RETENTION_HOURS).",
        "List the jobs with `GET /jobs`."),
    "job-not-succeeded": ProblemType(
        409, "Job not succeeded",
        "The artifact, the report, the trace, the memory plan and the pictures exist only once the job has "
        "succeeded; `job_status` says where it is.",
        "Poll `GET /jobs/{id}` (it sends Retry-After) until `status` is `succeeded`."),
    "job-finished": ProblemType(
        409, "Job finished",
        "The job has already ended (succeeded, failed or canceled), so there is nothing to cancel.",
        "Nothing to do; delete it if it is no longer wanted."),
    "job-running": ProblemType(
        409, "Job running",
        "A running job cannot be deleted: its engine process still works in its files.",
        "Cancel it first (`POST /jobs/{id}/cancel`), then delete it once it has stopped."),
    "artifact-missing": ProblemType(
        404, "Artifact missing",
        "The job succeeded but its optimized model is no longer in storage (removed by hand, or a storage "
        "failure).",
        "Submit the model again; tell the operator."),
    "report-missing": ProblemType(
        404, "Report missing",
        "The job succeeded but its report is no longer in storage.",
        "Submit the model again; tell the operator."),
    "no-external-data": ProblemType(
        404, "No external data",
        "Only a model over 2 GB keeps its weights in a second file; this job's model keeps them inside.",
        "Download `/jobs/{id}/artifact` alone."),
    "no-memory-report": ProblemType(
        404, "No memory report",
        "The job's pipeline did not run the memory planning pass (a plugin pipeline without it, or the pass "
        "disabled), so there are no memory estimates.",
        "Submit without disabling `memory_plan`, or with a pipeline that runs it."),
    "no-such-memory-space": ProblemType(
        404, "No such memory space",
        "The memory plan has no arena in the space named by `space`; `detail` lists the spaces it has.",
        "Ask for one of those, or for all (no `space`)."),
    "no-graph-picture": ProblemType(
        404, "No graph picture",
        "The optimized graph could not be drawn: it has more nodes than pictures are drawn for, or Graphviz "
        "took too long or failed.",
        "Download the model and run `mirserve draw model.onnx -o graph.svg --max-nodes N` locally."),
    "graphviz-missing": ProblemType(
        503, "Graphviz missing",
        "The server has no Graphviz (`dot`), which lays out the graph picture.",
        "Ask the operator to install Graphviz, or draw locally with `mirserve draw` (DOT needs nothing)."),
    "queue-unavailable": ProblemType(
        503, "Queue unavailable",
        "The job queue (SQLite or Redis) did not accept the job, so nothing was kept.",
        "Try again after Retry-After seconds."),
    "queue-full": ProblemType(
        503, "Queue full",
        "As many jobs as the service queues (MIRSERVE_MAX_QUEUED) are waiting for a worker, so the submission "
        "was refused before its upload was read; nothing was kept. `queued` and `max_queued` say how full.",
        "Submit again after Retry-After seconds; an operator can add workers (`mirserve worker`)."),
    "not-ready": ProblemType(
        503, "Not ready",
        "`/readyz` found a dependency that does not answer: the database, the storage, the queue, or no worker "
        "sent a heartbeat lately. `checks` says which.",
        "Wait (Retry-After), or start a worker (`mirserve worker`)."),
    "problem-type-not-found": ProblemType(
        404, "Problem type not found",
        "The page of a problem type that does not exist was asked for.",
        "See the list of problem types at /problems."),
    "internal-error": ProblemType(
        500, "Internal error",
        "The server failed to handle the request because of a bug or an unexpected state; the details are in "
        "its log, never in the answer.",
        "Try again; if it persists, tell the operator the time and the request path (`instance`)."),
}
