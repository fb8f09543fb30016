"""Running one attempt of a job: claim it, supervise the engine child, then settle the outcome in one commit.

While the child runs, the runner is the only writer for the job: it records progress, renews the lease every
``heartbeat_seconds``, and kills the child when the job is canceled, runs past its time limit, loses its lease
(the reaper gave the job to someone else), or the worker shuts down. Outcomes:

- the child's verdict is success: publish the attempt's outputs (conditional on the lease) and drop the
  other attempts' directories;
- the child's verdict is a failure (a bad model, bad options, a verification failure): fail, no retry;
- the child was killed from outside (the OOM killer, an operator): give the job back to the queue, up to the
  maximum of attempts, since a rerun may well succeed;
- the child crashed on its own (a signal like SIGSEGV, no verdict): fail, as a rerun would crash again.
"""
from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from worker.jobs.config import JobSettings
from worker.jobs.engine_process import ChildSpec, EngineProcess, describe_exit
from worker.jobs.files import JobFiles, artifact_name, read_bounded, sha256_of, tail
from worker.jobs.report import PathNames, Report, ReportError
from worker.jobs.result_cache import cache_key
from worker.jobs.storage import ObjectMissing
from worker.jobs.store import Job, JobState, JobStore, Lease

log = logging.getLogger("mirserve.runner")

RESULT_LIMIT = 1 << 20
REPORT_LIMIT = 64 << 20
#: How much of the end of an engine log is kept with a published attempt.
LOG_LIMIT = 1 << 20
PROGRESS_INTERVAL = 0.1
#: Signals that mean "stopped from outside" rather than "crashed": the attempt is retried.
EXTERNAL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class Stop(enum.Enum):
    """Why the runner stopped watching the child."""

    EXITED = "exited"
    CANCELED = "canceled"
    TIMED_OUT = "timed out"
    LEASE_LOST = "lease lost"
    SHUTDOWN = "worker shutdown"


class JobRunner:
    def __init__(self, store: JobStore, files: JobFiles, config: JobSettings, worker_id: str,
                 enqueue: Callable[[str], None]):
        self.store = store
        self.files = files
        self.config = config
        self.worker_id = worker_id
        self.enqueue = enqueue
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._lock = threading.Lock()
        self._active: dict[str, EngineProcess] = {}
        self._last_pass: dict[str, str] = {}  # the pass each running job reported last, for the logs

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._active)

    def drain(self) -> None:
        """Claim no more jobs; running attempts go on."""
        self._draining.set()

    def stop(self) -> None:
        """Claim no more jobs and abort every running attempt, releasing its lease: its job goes back to the
        queue at once, for another worker, and is not failed even when its attempts are spent."""
        self._draining.set()
        self._stopping.set()

    def run(self, job_id: str) -> JobState | None:
        """Run one attempt of ``job_id`` if it is queued; returns the job's state afterwards (None: not ours)."""
        if self._draining.is_set():
            self.enqueue(job_id)  # this worker is going away; leave the job to another
            return None
        job = self.store.claim(job_id, self.worker_id, self.config.lease_seconds)
        if job is None:
            return None  # canceled, deleted or taken since this message was sent
        lease = job.lease
        log.info("attempt started", extra={"job_id": job_id, "attempt": lease.attempt})
        attempt_dir = self.files.attempt_dir(job_id, lease.attempt)
        shutil.rmtree(attempt_dir, ignore_errors=True)  # a leftover of a crashed run
        attempt_dir.mkdir(parents=True)
        try:
            return self._run_attempt(job, lease, attempt_dir)
        finally:
            shutil.rmtree(attempt_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                attempt_dir.parent.rmdir()  # the job's scratch directory, once no attempt of it is left

    def _address_space(self, job: Job) -> int:
        """The engine process's address-space limit: the job memory limit plus three times the upload, since
        the engine maps the model's weights (its file and external data) rather than reading them, and its
        verification child maps the input and the output again; mapped files are address space, not memory.
        0 (no limit) stays 0."""
        if self.config.job_memory_mb <= 0:
            return 0
        return (self.config.job_memory_mb << 20) + 3 * max(0, int(job.input_bytes))

    def _run_attempt(self, job: Job, lease: Lease, attempt_dir: Path) -> JobState | None:
        started = time.monotonic()
        try:
            model = self._input(job, attempt_dir)
        except ObjectMissing:
            failed = self._fail(lease, "ModelError", "the uploaded model is missing from storage", "model")
            return JobState.FAILED if failed else None
        spec = ChildSpec(engine=self.config.engine, model=str(model), attempt_dir=str(attempt_dir),
                         options=job.spec.engine_options(), memory_bytes=self._address_space(job),
                         nice=self.config.job_nice, data_dir=str(self.config.data_dir),
                         max_unpacked_bytes=self.config.archive_limits.max_unpacked_bytes)
        process = EngineProcess(spec, warm=self.config.warm_engines)
        with self._lock:
            self._active[job.id] = process
        try:
            self.store.set_child(lease, process.pid)
            stop = self._supervise(lease, process)
            names = self._path_names(job, model, attempt_dir)
            state = self._settle(job, lease, stop, process, attempt_dir, names)
        finally:
            with self._lock:
                self._active.pop(job.id, None)
            if process.poll() is None:
                process.kill()
            process.close()
        log.info("attempt ended", extra={"job_id": job.id, "attempt": lease.attempt,
                                         "status": state.value if state else "lease lost",
                                         "seconds": round(time.monotonic() - started, 3)})
        self._last_pass.pop(job.id, None)
        return state

    def _input(self, job: Job, attempt_dir: Path) -> Path:
        """The uploaded model as a local file: in place in a local store, else copied into the scratch."""
        key = self.files.input_key(job.id)
        local = self.files.storage.local_path(key)
        if local is not None:
            if not local.is_file():
                raise ObjectMissing(key)
            return local
        copy = attempt_dir / "input.onnx"
        self.files.storage.get_file(key, copy)
        return copy

    def _path_names(self, job: Job, model: Path, attempt_dir: Path) -> PathNames:
        """What the user calls the files the engine process was given: its report and errors use these."""
        return PathNames({model: job.input_filename,
                          attempt_dir / "model.onnx": artifact_name(job.input_filename),
                          attempt_dir / "model.onnx.data": "model.onnx.data",
                          f"{attempt_dir}{os.sep}": "", attempt_dir: ".",
                          self.config.data_dir: "<data dir>"})

    def _supervise(self, lease: Lease, process: EngineProcess) -> Stop:
        config = self.config
        deadline = time.monotonic() + config.job_time_limit_seconds
        next_beat = time.monotonic() + config.heartbeat_seconds
        last_written = 0.0
        pending = None
        while True:
            reports = process.read_progress(config.poll_seconds)
            if reports:
                pending = reports[-1]
                self._last_pass[lease.job_id] = pending[2]  # (index, total, pass)
            exited = process.poll() is not None
            if exited:
                reports = process.read_progress(0)
                pending = reports[-1] if reports else pending
            now = time.monotonic()
            due = now >= next_beat or (pending is not None and now - last_written >= PROGRESS_INTERVAL)
            if due or (exited and pending is not None):
                beat = self.store.heartbeat(lease, config.lease_seconds, pending)
                if pending is not None:
                    last_written, pending = now, None
                next_beat = now + config.heartbeat_seconds
                if not beat.owned:
                    return Stop.LEASE_LOST
                if beat.cancel_requested:
                    return Stop.CANCELED
            if exited:
                return Stop.EXITED
            if now > deadline:
                return Stop.TIMED_OUT
            if self._stopping.is_set():
                return Stop.SHUTDOWN

    def _settle(self, job: Job, lease: Lease, stop: Stop, process: EngineProcess, attempt_dir: Path,
                names: PathNames) -> JobState | None:
        if stop is not Stop.EXITED:
            process.kill()
        if stop is Stop.LEASE_LOST:
            shutil.rmtree(attempt_dir, ignore_errors=True)
            return None
        if stop is Stop.CANCELED:
            return JobState.CANCELED if self.store.cancel(lease) else None
        if stop is Stop.TIMED_OUT:
            limit = self.config.job_time_limit_seconds
            message = f"the optimization took longer than the job time limit of {limit:g} s"
            return JobState.FAILED if self._fail(lease, "TimeLimitError", message) else None
        if stop is Stop.SHUTDOWN:
            return self._retry(lease, "the worker running it shut down", release=True)
        return self._settle_exit(job, lease, process.wait(), attempt_dir, names)

    def _settle_exit(self, job: Job, lease: Lease, returncode: int, attempt_dir: Path,
                     names: PathNames) -> JobState | None:
        verdict = _read_json(attempt_dir / "result.json", RESULT_LIMIT)
        if isinstance(verdict, dict) and verdict.get("ok") and returncode == 0:
            identity = verdict.get("engine")
            key = cache_key(job.input_sha256, job.spec, identity) if isinstance(identity, dict) else None
            return self._publish(lease, attempt_dir, names, key)
        if isinstance(verdict, dict) and not verdict.get("ok"):
            error = verdict.get("error") if isinstance(verdict.get("error"), dict) else {}
            message = names.text(str(error.get("message") or "the engine failed without a message"))
            failed = self._fail(lease, str(error.get("type") or "InternalError"), message, error.get("field"))
            return JobState.FAILED if failed else None
        how = describe_exit(returncode)
        if returncode < 0 and -returncode in EXTERNAL_SIGNALS:
            return self._retry(lease, f"the engine process was {how}")
        message = (f"the engine process crashed ({how}) before finishing; the model may be malformed or "
                   f"need more than the job memory limit of {self.config.job_memory_mb} MiB")
        return JobState.FAILED if self._fail(lease, "EngineCrash", message) else None

    def _publish(self, lease: Lease, attempt_dir: Path, names: PathNames,
                 key: str | None = None) -> JobState | None:
        """Publish a successful attempt; ``key`` is its result's cache key (None: not offered for reuse)."""
        artifact = attempt_dir / "model.onnx"
        try:
            report = Report.from_engine(_read_json(attempt_dir / "report.json", REPORT_LIMIT), names)
        except ReportError as error:
            message = f"the engine reported success but wrote no usable report ({error})"
            return JobState.FAILED if self._fail(lease, "InternalError", message) else None
        if not artifact.is_file():
            message = "the engine reported success but wrote no model"
            return JobState.FAILED if self._fail(lease, "InternalError", message) else None
        digest, size = sha256_of(artifact)
        job_id, attempt, storage = lease.job_id, lease.attempt, self.files.storage
        # Outputs first, under this attempt's own keys; the commit below is what makes them the job's.
        storage.put_bytes(self.files.report_key(job_id, attempt), report.to_json())  # only the published form
        storage.put_bytes(self.files.log_key(job_id, attempt), tail(attempt_dir / "engine.log", LOG_LIMIT))
        if (attempt_dir / "model.onnx.data").is_file():
            storage.put_file(self.files.artifact_data_key(job_id, attempt), attempt_dir / "model.onnx.data")
        storage.put_file(self.files.artifact_key(job_id, attempt), artifact)
        if not self.store.publish(lease, artifact_bytes=size, artifact_sha256=digest, summary=report.summary(),
                                  cache_key=key):
            storage.delete_prefix(self.files.attempt_prefix(job_id, attempt))
            return None
        self.files.remove_attempts_except(job_id, keep=attempt)
        return JobState.SUCCEEDED

    def _fail(self, lease: Lease, error_type: str, message: str, field: str | None = None) -> bool:
        """Fail the job (if the attempt still owns it) and log why, with the pass it was in."""
        failed = self.store.fail(lease, error_type, message, field)
        if failed:
            log.warning("job failed", extra={"job_id": lease.job_id, "attempt": lease.attempt,
                                             "error_type": error_type, "reason": message, "field": field,
                                             "pass": self._last_pass.get(lease.job_id)})
        return failed

    def _retry(self, lease: Lease, reason: str, *, release: bool = False) -> JobState | None:
        log.warning("attempt given back to the queue", extra={"job_id": lease.job_id, "attempt": lease.attempt,
                                                              "reason": reason,
                                                              "pass": self._last_pass.get(lease.job_id)})
        state = (self.store.release if release else self.store.retry)(lease, reason)
        if state is JobState.QUEUED:
            self.enqueue(lease.job_id)
        return state


def _read_json(path: Path, limit: int):
    try:
        with open(path, "rb") as stream:
            return json.loads(read_bounded(stream, limit))
    except (OSError, ValueError):
        return None
