"""Periodic repairs that keep the job table and the queue honest when processes die.

Every worker runs one; each step is a conditional update, so several reapers never do the same work twice.

- expired leases: a running job whose worker stopped heartbeating is requeued (or failed once its attempts
  are used up, or marked canceled if cancel was requested);
- lost messages: a job queued for longer than ``requeue_after_seconds`` gets a fresh message (a duplicate is
  harmless: only one claim can win);
- retention: finished jobs older than ``retention_hours`` are deleted with their files;
- leftovers, from processes that died mid-write: abandoned uploads, stored files of jobs without a row, and
  the scratch directories of workers that are gone.
"""
from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from datetime import timedelta

from worker.jobs.config import JobSettings
from worker.jobs.files import JobFiles
from worker.jobs.queue import JobQueue
from worker.jobs.store import JobState, JobStore

log = logging.getLogger("mirserve.reaper")

LEFTOVER_AGE_SECONDS = 3600.0
#: Sweeping lists every job directory, so it runs far less often than the cheap indexed steps.
SWEEP_EVERY_SECONDS = 300.0
WORKER_FORGET_AFTER = timedelta(days=1)


@dataclass
class ReapReport:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    canceled: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    purged: list[str] = field(default_factory=list)
    leftovers: int = 0


class Reaper:
    def __init__(self, store: JobStore, files: JobFiles, queue: JobQueue, config: JobSettings):
        self.store = store
        self.files = files
        self.queue = queue
        self.config = config
        self._last_sweep = float("-inf")

    def run_once(self, *, sweep: bool | None = None) -> ReapReport:
        """One round; ``sweep`` forces (True) or skips (False) the leftovers sweep, None runs it when due."""
        report = ReapReport()
        self._reap_leases(report)
        for job_id in self.store.touch_stale_queued(self.config.requeue_after_seconds):
            self.queue.enqueue(job_id)
            report.resent.append(job_id)
        if self.config.retention_hours > 0:
            self._purge_old(report)
        if sweep or (sweep is None and time.monotonic() - self._last_sweep >= SWEEP_EVERY_SECONDS):
            self._last_sweep = time.monotonic()
            report.leftovers = self._sweep_leftovers()
        self.store.forget_workers_before(self.store.clock() - WORKER_FORGET_AFTER)
        return report

    def _reap_leases(self, report: ReapReport) -> None:
        for reaped in self.store.reap_expired():
            if reaped.state is JobState.QUEUED:
                self.queue.enqueue(reaped.job_id)
                report.requeued.append(reaped.job_id)
            elif reaped.state is JobState.CANCELED:
                report.canceled.append(reaped.job_id)
            else:
                report.failed.append(reaped.job_id)
            log.warning("attempt lost its worker", extra={"job_id": reaped.job_id, "attempt": reaped.attempt,
                                                          "status": str(getattr(reaped.state, "value", reaped.state))})

    def _purge_old(self, report: ReapReport) -> None:
        cutoff = self.store.clock() - timedelta(hours=self.config.retention_hours)
        for job_id in self.store.finished_before(cutoff):
            if self.store.delete(job_id):
                self.files.remove_job(job_id)
                report.purged.append(job_id)

    def _sweep_leftovers(self) -> int:
        removed = self.files.storage.sweep_partial(LEFTOVER_AGE_SECONDS)
        stored = self.files.job_ids()
        known = self.store.existing_ids(stored)
        for job_id in stored:
            if job_id not in known and self._untouched(job_id, LEFTOVER_AGE_SECONDS):
                self.files.remove_job(job_id)
                removed += 1
        return removed + self._sweep_scratch()

    def _untouched(self, job_id: str, seconds: float) -> bool:
        """Nothing of the job was written for that long (an upload still arriving has no row yet)."""
        try:
            newest = self.files.storage.newest_change(self.files.job_prefix(job_id))
        except ValueError:  # not a job id we would have made
            return True
        return newest is None or newest < time.time() - seconds

    def _sweep_scratch(self) -> int:
        """Scratch directories of workers that stopped heartbeating long ago (killed: they could not clean)."""
        own = self.files.scratch
        if own is None or not own.parent.is_dir():
            return 0
        live = {w["id"] for w in self.store.live_workers(self.config.lease_seconds)}
        removed = 0
        for entry in own.parent.iterdir():
            try:
                stale = entry.stat().st_mtime < time.time() - LEFTOVER_AGE_SECONDS
            except FileNotFoundError:
                continue
            if entry != own and entry.name not in live and stale:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        return removed
