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

from worker.jobs.config import JobConfig
from worker.jobs.files import JobFiles, read_bounded, sha256_of
from worker.jobs.process import ChildSpec, EngineProcess, describe_exit
from worker.jobs.store import JobState, JobStore, Lease
from worker.jobs.summary import summarize

log = logging.getLogger("mirserve.runner")

RESULT_LIMIT = 1 << 20
REPORT_LIMIT = 64 << 20
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
    def __init__(self, store: JobStore, files: JobFiles, config: JobConfig, worker_id: str,
                 enqueue: Callable[[str], None]):
        self.store = store
        self.files = files
        self.config = config
        self.worker_id = worker_id
        self.enqueue = enqueue
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._active: dict[str, EngineProcess] = {}

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._active)

    def stop(self) -> None:
        """Abort every running attempt; their jobs go back to the queue."""
        self._stopping.set()

    def run(self, job_id: str) -> JobState | None:
        """Run one attempt of ``job_id`` if it is queued; returns the job's state afterwards (None: not ours)."""
        if self._stopping.is_set():
            self.enqueue(job_id)  # this worker is going away; leave the job to another
            return None
        lease = self.store.claim(job_id, self.worker_id, self.config.lease_seconds)
        if lease is None:
            return None  # canceled, deleted or taken since this message was sent
        log.info("job %s: attempt %d started", job_id, lease.attempt)
        input_path = self.files.input_path(job_id)
        if not input_path.is_file():
            self.store.fail(lease, "ModelError", "the uploaded model is missing from storage", "model")
            return JobState.FAILED
        attempt_dir = self.files.new_attempt_dir(job_id, lease.attempt)
        job = self.store.get(job_id)
        spec = ChildSpec(engine=self.config.engine, model=str(input_path), attempt_dir=str(attempt_dir),
                         options=dict(job.options, places=job.places),
                         memory_bytes=self.config.job_memory_mb << 20, nice=self.config.job_nice,
                         parent_pid=os.getpid())
        process = EngineProcess(spec, attempt_dir / "engine.log")
        with self._lock:
            self._active[job_id] = process
        try:
            self.store.set_child(lease, process.pid)
            stop = self._supervise(lease, process)
            # Error messages name files; the user knows the upload by its own name, not our paths.
            redact = {str(input_path): job.input_filename, str(attempt_dir / "model.onnx"): "the optimized model"}
            state = self._settle(lease, stop, process, attempt_dir, redact)
        finally:
            with self._lock:
                self._active.pop(job_id, None)
            if process.poll() is None:
                process.kill()
            process.close()
        log.info("job %s: attempt %d ended: %s", job_id, lease.attempt, state or "lease lost")
        return state

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

    def _settle(self, lease: Lease, stop: Stop, process: EngineProcess, attempt_dir: Path,
                redact: dict[str, str]) -> JobState | None:
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
            return JobState.FAILED if self.store.fail(lease, "TimeLimitError", message) else None
        if stop is Stop.SHUTDOWN:
            return self._retry(lease, "the worker running it shut down")
        return self._settle_exit(lease, process.wait(), attempt_dir, redact)

    def _settle_exit(self, lease: Lease, returncode: int, attempt_dir: Path,
                     redact: dict[str, str]) -> JobState | None:
        verdict = _read_json(attempt_dir / "result.json", RESULT_LIMIT)
        if verdict is not None and verdict.get("ok") and returncode == 0:
            return self._publish(lease, attempt_dir)
        if verdict is not None and not verdict.get("ok"):
            error = verdict.get("error") or {}
            message = str(error.get("message") or "the engine failed without a message")
            for path, name in redact.items():
                message = message.replace(path, name)
            failed = self.store.fail(lease, str(error.get("type") or "InternalError"), message, error.get("field"))
            return JobState.FAILED if failed else None
        how = describe_exit(returncode)
        if returncode < 0 and -returncode in EXTERNAL_SIGNALS:
            return self._retry(lease, f"the engine process was {how}")
        message = (f"the engine process crashed ({how}) before finishing; the model may be malformed or "
                   f"need more than the job memory limit of {self.config.job_memory_mb} MiB")
        return JobState.FAILED if self.store.fail(lease, "EngineCrash", message) else None

    def _publish(self, lease: Lease, attempt_dir: Path) -> JobState | None:
        artifact = attempt_dir / "model.onnx"
        report = _read_json(attempt_dir / "report.json", REPORT_LIMIT)
        if not artifact.is_file() or report is None:
            message = "the engine reported success but wrote no model or no readable report"
            return JobState.FAILED if self.store.fail(lease, "InternalError", message) else None
        digest, size = sha256_of(artifact)
        if not self.store.publish(lease, artifact_bytes=size, artifact_sha256=digest, summary=summarize(report)):
            shutil.rmtree(attempt_dir, ignore_errors=True)
            return None
        self.files.remove_attempts_except(lease.job_id, keep=lease.attempt)
        return JobState.SUCCEEDED

    def _retry(self, lease: Lease, reason: str) -> JobState | None:
        state = self.store.retry(lease, reason)
        if state is JobState.QUEUED:
            self.enqueue(lease.job_id)
        return state


def _read_json(path: Path, limit: int):
    try:
        with open(path, "rb") as stream:
            return json.loads(read_bounded(stream, limit))
    except (OSError, ValueError):
        return None
