"""The job side: the job table, the queue, the runner that supervises the engine, the reaper, the worker.

The job table is the source of truth; the queue (huey) only carries "job X may be ready" wake-ups and may
lose them (huey delivers at most once), which the reaper repairs. Nothing here imports the web layer, and of
the engine only ``worker.engine.api`` and ``worker.engine.errors``.

The names below are the public surface the API (``app``) builds on; each is imported from its module on first
use, so that an engine process, which imports ``worker.jobs.child``, does not pay for the database and queue
libraries it never touches.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "JobSettings": "config", "load_settings": "config", "DEFAULT_ENGINE": "config",
    "JobSpec": "spec", "Report": "report",
    "Job": "store", "JobState": "store", "JobStore": "store", "NewJob": "store", "new_job_id": "store",
    "IdempotencyConflict": "store", "OwnerUsage": "store",
    "ApiKey": "keys", "KeyRefused": "keys", "KeyStore": "keys", "Role": "keys",
    "SchemaError": "schema",
    "ArchiveError": "archive", "check_upload": "archive",
    "JobFiles": "files", "artifact_name": "files",
    "ObjectMissing": "storage", "ObjectWriter": "storage", "open_storage": "storage",
    "JobQueue": "queue",
    "cache_key": "result_cache", "engine_identity": "result_cache", "reuse_result": "result_cache",
    "JobWorker": "consumer",
    "WorkerSupervisor": "supervisor",
    "add_worker_arguments": "cli", "run_worker": "cli", "configure_logging": "logs",
    "CallbackRefused": "callbacks", "CallbackStore": "callbacks", "check_callback_url": "callbacks",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from worker.jobs.archive import ArchiveError, check_upload
    from worker.jobs.cli import add_worker_arguments, run_worker
    from worker.jobs.callbacks import CallbackRefused, CallbackStore, check_callback_url
    from worker.jobs.logs import configure_logging
    from worker.jobs.config import DEFAULT_ENGINE, JobSettings, load_settings
    from worker.jobs.consumer import JobWorker
    from worker.jobs.files import JobFiles, artifact_name
    from worker.jobs.keys import ApiKey, KeyRefused, KeyStore, Role
    from worker.jobs.queue import JobQueue
    from worker.jobs.report import Report
    from worker.jobs.result_cache import cache_key, engine_identity, reuse_result
    from worker.jobs.schema import SchemaError
    from worker.jobs.spec import JobSpec
    from worker.jobs.storage import ObjectMissing, ObjectWriter, open_storage
    from worker.jobs.store import IdempotencyConflict, Job, JobState, JobStore, NewJob, OwnerUsage, new_job_id
    from worker.jobs.supervisor import WorkerSupervisor


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker.jobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"worker.jobs.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
