"""The job table: the source of truth for every job (state, attempt, lease, progress, outcome).

Every state change is one conditional UPDATE, so two processes can never both win: a runner claims a job only
while it is ``queued``, and every later write of that attempt (heartbeat, progress, publish, fail) names the
attempt's lease token and succeeds only while that token still owns the job. A runner whose lease was reaped
therefore cannot publish, and an artifact is published at most once.
"""
from __future__ import annotations

import enum
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable

from sqlalchemy import (JSON, BigInteger, Boolean, Column, ForeignKey, Integer, MetaData, String, Table, Text, and_,
                        delete, func, insert, select, text, true, update)
from sqlalchemy.exc import IntegrityError

from worker.jobs.db import UTCDateTime, create_db_engine, read_transaction, utcnow, write_transaction
from worker.jobs.spec import JobSpec


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    def __str__(self) -> str:
        return self.value

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELED})

metadata = MetaData()

jobs_table = Table(
    "mirserve_jobs", metadata,
    Column("id", String(36), primary_key=True),
    Column("state", String(16), nullable=False, index=True),
    Column("created_at", UTCDateTime, nullable=False, index=True),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("enqueued_at", UTCDateTime, nullable=True),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True, index=True),
    Column("attempt", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False),
    Column("lease_token", String(32), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True, index=True),
    Column("worker_id", String(200), nullable=True),
    Column("child_pid", Integer, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("progress_pass", String(200), nullable=True),
    Column("progress_index", Integer, nullable=True),
    Column("progress_total", Integer, nullable=True),
    Column("input_filename", String(255), nullable=False),
    Column("input_bytes", BigInteger, nullable=False),
    Column("input_sha256", String(64), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("idempotency_key", String(255), nullable=True, unique=True),
    Column("request_fingerprint", String(64), nullable=True),
    Column("artifact_attempt", Integer, nullable=True),
    Column("artifact_bytes", BigInteger, nullable=True),
    Column("artifact_sha256", String(64), nullable=True),
    Column("error_type", String(100), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("error_field", String(200), nullable=True),
    Column("retry_reason", Text, nullable=True),
    Column("summary", JSON, nullable=True),
    Column("cache_key", String(64), nullable=True, index=True),
    Column("cached_from", String(36), nullable=True),
    # Who submitted it: the API key's owner (None with MIRSERVE_AUTH=none, and for jobs made before owners).
    Column("owner", String(200), nullable=True, index=True),
)

workers_table = Table(
    "mirserve_workers", metadata,
    Column("id", String(200), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("running", Integer, nullable=False, default=0),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False, index=True),
)

#: The outbox of job-ended notifications (``worker.jobs.callbacks``): one row per job with a callback_url.
callbacks_table = Table(
    "mirserve_callbacks", metadata,
    Column("job_id", String(36), ForeignKey("mirserve_jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("url", String(2048), nullable=False),
    Column("state", String(16), nullable=False, index=True),  # pending, delivered, failed
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_at", UTCDateTime, nullable=False, index=True),
    Column("delivered_at", UTCDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
)

#: API keys (``worker.jobs.keys``): the key id is the lookup, the secret is kept only as its scrypt hash.
api_keys_table = Table(
    "mirserve_api_keys", metadata,
    Column("id", String(32), primary_key=True),
    Column("owner", String(200), nullable=False, index=True),
    Column("role", String(16), nullable=False),
    Column("secret_hash", String(255), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
)


@dataclass(frozen=True)
class Job:
    """One row of the job table, as read at one moment."""

    id: str
    state: JobState
    created_at: datetime
    updated_at: datetime
    enqueued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempt: int
    max_attempts: int
    lease_token: str | None
    lease_expires_at: datetime | None
    worker_id: str | None
    child_pid: int | None
    cancel_requested: bool
    progress_pass: str | None
    progress_index: int | None
    progress_total: int | None
    input_filename: str
    input_bytes: int
    input_sha256: str
    spec: JobSpec
    idempotency_key: str | None
    request_fingerprint: str | None
    artifact_attempt: int | None
    artifact_bytes: int | None
    artifact_sha256: str | None
    error_type: str | None
    error_message: str | None
    error_field: str | None
    retry_reason: str | None
    summary: dict[str, Any] | None
    cache_key: str | None
    cached_from: str | None
    owner: str | None

    @classmethod
    def from_row(cls, row) -> "Job":
        values = dict(row._mapping)
        values["state"] = JobState(values["state"])
        values["cancel_requested"] = bool(values["cancel_requested"])
        values["spec"] = JobSpec.from_dict(values["spec"])
        return cls(**values)

    @property
    def lease(self) -> "Lease":
        """The lease of the running attempt, as the claim that started it returned it."""
        if self.state is not JobState.RUNNING or self.lease_token is None:
            raise ValueError(f"job {self.id} is {self.state}, not running under a lease")
        return Lease(self.id, self.attempt, self.lease_token, self.max_attempts)


def new_job_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class NewJob:
    """What the API knows about a job when it accepts the upload."""

    input_filename: str
    input_bytes: int
    input_sha256: str
    spec: JobSpec
    max_attempts: int
    idempotency_key: str | None = None
    request_fingerprint: str | None = None
    owner: str | None = None
    id: str = field(default_factory=new_job_id)


@dataclass(frozen=True)
class OwnerUsage:
    """One owner's share of the service at one moment (``JobStore.usage``)."""

    active_jobs: int    # queued or running
    stored_bytes: int   # uploads and artifacts of the jobs the table holds


@dataclass(frozen=True)
class Lease:
    """What a runner holds while it runs one attempt of a job; every write of the attempt names it."""

    job_id: str
    attempt: int
    token: str
    max_attempts: int


@dataclass(frozen=True)
class Beat:
    owned: bool
    cancel_requested: bool = False


@dataclass(frozen=True)
class Reaped:
    job_id: str
    state: JobState
    attempt: int


class IdempotencyConflict(Exception):
    """Another job already holds this Idempotency-Key."""

    def __init__(self, existing: Job):
        super().__init__(f"idempotency key already used by job {existing.id}")
        self.existing = existing


class JobStore:
    """All reads and writes of the job and worker tables."""

    def __init__(self, url: str, *, clock: Callable[[], datetime] = utcnow):
        self.url = url
        self.engine = create_db_engine(url)
        self.clock = clock

    def check_schema(self) -> None:
        """Raise ``SchemaError`` (saying what to run) unless the tables are at this code's revision."""
        from worker.jobs.schema import check

        check(self.engine)

    def upgrade_schema(self, revision: str = "head") -> str:
        """Create or upgrade the tables to ``revision`` (``mirserve db upgrade``); returns the revision."""
        from worker.jobs.schema import upgrade

        return upgrade(self.engine, revision)

    def downgrade_schema(self, revision: str) -> str | None:
        from worker.jobs.schema import downgrade

        return downgrade(self.engine, revision)

    def schema_revision(self) -> tuple[str | None, str]:
        """The database's revision and this code's."""
        from worker.jobs.schema import current_revision, head_revision

        return current_revision(self.engine), head_revision()

    def dispose(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with read_transaction(self.engine) as conn:
            conn.execute(text("SELECT 1"))

    # ---- the API side -------------------------------------------------------------------------------------

    def create(self, new: NewJob, cached: "Job | None" = None) -> Job:
        """Insert a queued job; raises IdempotencyConflict when its key is taken.

        With ``cached`` (a succeeded job whose outputs were copied to the new job's cached attempt, see
        ``worker.jobs.result_cache``), the job is inserted succeeded with that job's result, and no attempt.
        """
        now = self.clock()
        values = dict(id=new.id, state=JobState.QUEUED.value, created_at=now, updated_at=now, enqueued_at=now,
                      attempt=0, max_attempts=new.max_attempts, cancel_requested=False,
                      input_filename=new.input_filename, input_bytes=new.input_bytes,
                      input_sha256=new.input_sha256, spec=new.spec.to_dict(),
                      idempotency_key=new.idempotency_key, request_fingerprint=new.request_fingerprint,
                      owner=new.owner)
        if cached is not None:
            from worker.jobs.files import CACHED_ATTEMPT

            values.update(state=JobState.SUCCEEDED.value, enqueued_at=None, started_at=now, finished_at=now,
                          artifact_attempt=CACHED_ATTEMPT, artifact_bytes=cached.artifact_bytes,
                          artifact_sha256=cached.artifact_sha256, summary=cached.summary,
                          cache_key=cached.cache_key, cached_from=cached.id)
        try:
            with write_transaction(self.engine) as conn:
                row = conn.execute(insert(jobs_table).values(**values).returning(*jobs_table.c)).one()
        except IntegrityError:
            existing = self.find_by_idempotency_key(new.idempotency_key) if new.idempotency_key else None
            if existing is None:
                raise
            raise IdempotencyConflict(existing) from None
        return Job.from_row(row)

    def get(self, job_id: str) -> Job | None:
        with read_transaction(self.engine) as conn:
            row = conn.execute(select(jobs_table).where(jobs_table.c.id == job_id)).first()
        return Job.from_row(row) if row is not None else None

    def find_cached(self, cache_key: str, owner: str | None = None) -> Job | None:
        """The newest succeeded job of ``owner`` (None: jobs without one) whose result has this cache key
        (``worker.jobs.result_cache``)."""
        c = jobs_table.c
        same_owner = c.owner.is_(None) if owner is None else c.owner == owner
        query = (select(jobs_table).where(c.cache_key == cache_key, c.state == JobState.SUCCEEDED.value, same_owner)
                 .order_by(c.finished_at.desc()).limit(1))
        with read_transaction(self.engine) as conn:
            row = conn.execute(query).first()
        return Job.from_row(row) if row is not None else None

    def find_by_idempotency_key(self, key: str) -> Job | None:
        with read_transaction(self.engine) as conn:
            row = conn.execute(select(jobs_table).where(jobs_table.c.idempotency_key == key)).first()
        return Job.from_row(row) if row is not None else None

    def list(self, *, state: JobState | None = None, limit: int = 20, offset: int = 0,
             owner: str | None = None) -> tuple[list[Job], int]:
        """A page of jobs, newest first, and the total number matching; with ``owner``, only that owner's."""
        where = and_(jobs_table.c.state == state.value if state is not None else true(),
                     jobs_table.c.owner == owner if owner is not None else true())
        query = (select(jobs_table).where(where)
                 .order_by(jobs_table.c.created_at.desc(), jobs_table.c.id.desc()).limit(limit).offset(offset))
        with read_transaction(self.engine) as conn:
            rows = conn.execute(query).all()
            total = conn.execute(select(func.count()).select_from(jobs_table).where(where)).scalar_one()
        return [Job.from_row(r) for r in rows], total

    def usage(self, owner: str) -> "OwnerUsage":
        """What one owner holds now, for the quotas: unfinished jobs and stored bytes."""
        c = jobs_table.c
        active = [JobState.QUEUED.value, JobState.RUNNING.value]
        stored = func.coalesce(func.sum(c.input_bytes + func.coalesce(c.artifact_bytes, 0)), 0)
        with read_transaction(self.engine) as conn:
            jobs = conn.execute(select(func.count()).where(c.owner == owner, c.state.in_(active))).scalar_one()
            total = conn.execute(select(stored).where(c.owner == owner)).scalar_one()
        return OwnerUsage(active_jobs=int(jobs), stored_bytes=int(total))

    def counts(self) -> dict[JobState, int]:
        query = select(jobs_table.c.state, func.count()).group_by(jobs_table.c.state)
        with read_transaction(self.engine) as conn:
            found = {JobState(state): n for state, n in conn.execute(query)}
        return {state: found.get(state, 0) for state in JobState}

    def pass_failures(self) -> int:
        """Passes that failed soft (undone, the job went on) over the jobs the table holds."""
        failures = jobs_table.c.summary["pass_failures"].as_integer()
        with read_transaction(self.engine) as conn:
            return int(conn.execute(select(func.coalesce(func.sum(failures), 0))).scalar_one())

    def request_cancel(self, job_id: str) -> Job | None:
        """Cancel a queued job now; flag a running one for its runner (which kills the engine process).

        Returns the job as it is afterwards (a finished job unchanged), None when there is no such job.
        """
        now = self.clock()
        c = jobs_table.c
        with write_transaction(self.engine) as conn:
            row = conn.execute(update(jobs_table).where(c.id == job_id, c.state == JobState.QUEUED.value).values(
                state=JobState.CANCELED.value, finished_at=now, updated_at=now, cancel_requested=True)
                .returning(*jobs_table.c)).first()
            if row is None:
                row = conn.execute(update(jobs_table).where(c.id == job_id, c.state == JobState.RUNNING.value)
                                   .values(cancel_requested=True, updated_at=now).returning(*jobs_table.c)).first()
            if row is None:
                row = conn.execute(select(jobs_table).where(c.id == job_id)).first()
        return Job.from_row(row) if row is not None else None

    def delete(self, job_id: str, *, unless_state: Iterable[JobState] = ()) -> bool:
        """Delete a job row unless it is in one of ``unless_state``; True when a row went away."""
        c = jobs_table.c
        condition = c.id == job_id
        blocked = [s.value for s in unless_state]
        if blocked:
            condition = and_(condition, c.state.not_in(blocked))
        with write_transaction(self.engine) as conn:
            return conn.execute(delete(jobs_table).where(condition)).rowcount == 1

    # ---- the runner side ----------------------------------------------------------------------------------

    def claim(self, job_id: str, worker_id: str, lease_seconds: float) -> Job | None:
        """Move a queued job to running under a fresh lease (``job.lease``); None when it is not queued (any
        more). One statement: the conditional update returns the row it changed."""
        now = self.clock()
        token = secrets.token_hex(16)
        c = jobs_table.c
        with write_transaction(self.engine) as conn:
            row = conn.execute(
                update(jobs_table)
                .where(c.id == job_id, c.state == JobState.QUEUED.value, c.cancel_requested.is_(False))
                .values(state=JobState.RUNNING.value, attempt=c.attempt + 1, lease_token=token,
                        lease_expires_at=now + timedelta(seconds=lease_seconds), worker_id=worker_id,
                        child_pid=None, started_at=func.coalesce(c.started_at, now), updated_at=now,
                        progress_pass=None, progress_index=None, progress_total=None)
                .returning(*jobs_table.c)).first()
        return Job.from_row(row) if row is not None else None

    def _owned(self, lease: Lease, expired_before: datetime | None = None):
        """The rows this lease still owns; with ``expired_before``, only if the lease has also run out."""
        c = jobs_table.c
        condition = and_(c.id == lease.job_id, c.lease_token == lease.token, c.state == JobState.RUNNING.value)
        return and_(condition, c.lease_expires_at < expired_before) if expired_before else condition

    def set_child(self, lease: Lease, pid: int | None) -> bool:
        with write_transaction(self.engine) as conn:
            return conn.execute(update(jobs_table).where(self._owned(lease)).values(child_pid=pid)).rowcount == 1

    def heartbeat(self, lease: Lease, lease_seconds: float,
                  progress: tuple[int, int, str] | None = None) -> Beat:
        """Extend the lease (and record progress); says whether the lease is still ours and cancel is wanted."""
        now = self.clock()
        values: dict[str, Any] = dict(lease_expires_at=now + timedelta(seconds=lease_seconds), updated_at=now)
        if progress is not None:
            values.update(progress_index=progress[0], progress_total=progress[1], progress_pass=progress[2][:200])
        with write_transaction(self.engine) as conn:
            if conn.execute(update(jobs_table).where(self._owned(lease)).values(**values)).rowcount != 1:
                return Beat(owned=False)
            cancel = conn.execute(select(jobs_table.c.cancel_requested)
                                  .where(jobs_table.c.id == lease.job_id)).scalar_one()
        return Beat(owned=True, cancel_requested=bool(cancel))

    def publish(self, lease: Lease, *, artifact_bytes: int, artifact_sha256: str,
                summary: dict[str, Any], cache_key: str | None = None) -> bool:
        """Mark the attempt's outputs as the job's artifact, in one commit, if the lease is still ours;
        ``cache_key`` names the result for later jobs (``worker.jobs.result_cache``)."""
        return self._finish(lease, JobState.SUCCEEDED, artifact_attempt=lease.attempt,
                            artifact_bytes=artifact_bytes, artifact_sha256=artifact_sha256, summary=summary,
                            cache_key=cache_key)

    def fail(self, lease: Lease, error_type: str, message: str, error_field: str | None = None, *,
             expired_before: datetime | None = None) -> bool:
        return self._finish(lease, JobState.FAILED, expired_before, error_type=error_type, error_message=message,
                            error_field=error_field)

    def cancel(self, lease: Lease, *, expired_before: datetime | None = None) -> bool:
        return self._finish(lease, JobState.CANCELED, expired_before, error_type="Canceled",
                            error_message="the job was canceled while it was running")

    def _finish(self, lease: Lease, state: JobState, expired_before: datetime | None = None, **values) -> bool:
        now = self.clock()
        with write_transaction(self.engine) as conn:
            return conn.execute(update(jobs_table).where(self._owned(lease, expired_before)).values(
                state=state.value, finished_at=now, updated_at=now, lease_token=None, lease_expires_at=None,
                child_pid=None, **values)).rowcount == 1

    def retry(self, lease: Lease, reason: str, *, expired_before: datetime | None = None) -> JobState | None:
        """Give the job back to the queue after an attempt that died; fail it once attempts run out.

        Returns the new state, or None when the lease was no longer ours (or, with ``expired_before``, had
        been renewed meanwhile).
        """
        if lease.attempt >= lease.max_attempts:
            message = (f"{reason}; giving up after {lease.attempt} attempt(s) "
                       f"(the maximum is {lease.max_attempts})")
            failed = self.fail(lease, "AttemptsExhausted", message, expired_before=expired_before)
            return JobState.FAILED if failed else None
        return self.release(lease, reason, expired_before=expired_before)

    def release(self, lease: Lease, reason: str, *, expired_before: datetime | None = None) -> JobState | None:
        """Give the job back to the queue whatever its attempts (a worker shutting down: the attempt was not
        the job's fault); QUEUED, or None when the lease was no longer ours."""
        now = self.clock()
        with write_transaction(self.engine) as conn:
            requeued = conn.execute(update(jobs_table).where(self._owned(lease, expired_before)).values(
                state=JobState.QUEUED.value, lease_token=None, lease_expires_at=None, child_pid=None,
                worker_id=None, enqueued_at=now, updated_at=now,
                retry_reason=f"attempt {lease.attempt}: {reason}")).rowcount
        return JobState.QUEUED if requeued == 1 else None

    def count_queued(self) -> int:
        """Jobs waiting for a worker (the API's backpressure limit counts these)."""
        query = select(func.count()).select_from(jobs_table).where(jobs_table.c.state == JobState.QUEUED.value)
        with read_transaction(self.engine) as conn:
            return int(conn.execute(query).scalar_one())

    # ---- the reaper side ----------------------------------------------------------------------------------

    def reap_expired(self) -> list[Reaped]:
        """Requeue (or fail, or finish canceling) every running job whose lease has expired."""
        now = self.clock()
        c = jobs_table.c
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(c.id, c.attempt, c.max_attempts, c.lease_token, c.cancel_requested)
                                .where(c.state == JobState.RUNNING.value, c.lease_expires_at < now)).all()
        reaped = []
        for job_id, attempt, max_attempts, token, cancel in rows:
            lease = Lease(job_id, attempt, token, max_attempts)
            if cancel:
                state = JobState.CANCELED if self.cancel(lease, expired_before=now) else None
            else:
                state = self.retry(lease, "the worker running it stopped sending heartbeats (lease expired)",
                                   expired_before=now)
            if state is not None:
                reaped.append(Reaped(job_id, state, attempt))
        return reaped

    def touch_stale_queued(self, older_than_seconds: float) -> list[str]:
        """Queued jobs not enqueued for a while (their queue message may be lost); marks them re-enqueued."""
        now = self.clock()
        c = jobs_table.c
        cutoff = now - timedelta(seconds=older_than_seconds)
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(c.id, c.enqueued_at)
                                .where(c.state == JobState.QUEUED.value, c.enqueued_at < cutoff)).all()
        touched = []
        for job_id, enqueued_at in rows:
            with write_transaction(self.engine) as conn:
                if conn.execute(update(jobs_table).where(
                        c.id == job_id, c.state == JobState.QUEUED.value, c.enqueued_at == enqueued_at)
                        .values(enqueued_at=now)).rowcount == 1:
                    touched.append(job_id)
        return touched

    def finished_before(self, cutoff: datetime, limit: int = 100) -> list[str]:
        c = jobs_table.c
        terminal = [s.value for s in TERMINAL_STATES]
        with read_transaction(self.engine) as conn:
            return list(conn.execute(select(c.id).where(c.state.in_(terminal), c.finished_at < cutoff)
                                     .limit(limit)).scalars())

    def existing_ids(self, job_ids: Iterable[str]) -> set[str]:
        ids, found = list(job_ids), set()
        with read_transaction(self.engine) as conn:
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                found.update(conn.execute(select(jobs_table.c.id).where(jobs_table.c.id.in_(chunk))).scalars())
        return found

    # ---- workers ------------------------------------------------------------------------------------------

    def worker_beat(self, worker_id: str, *, hostname: str, pid: int, concurrency: int, running: int) -> None:
        now = self.clock()
        c = workers_table.c
        with write_transaction(self.engine) as conn:
            if conn.execute(update(workers_table).where(c.id == worker_id)
                            .values(heartbeat_at=now, running=running)).rowcount == 0:
                conn.execute(insert(workers_table).values(id=worker_id, hostname=hostname, pid=pid,
                                                          concurrency=concurrency, running=running,
                                                          started_at=now, heartbeat_at=now))

    def worker_gone(self, worker_id: str) -> None:
        with write_transaction(self.engine) as conn:
            conn.execute(delete(workers_table).where(workers_table.c.id == worker_id))

    def live_workers(self, within_seconds: float) -> list[dict[str, Any]]:
        cutoff = self.clock() - timedelta(seconds=within_seconds)
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(workers_table).where(workers_table.c.heartbeat_at >= cutoff)
                                .order_by(workers_table.c.heartbeat_at.desc())).all()
        return [dict(r._mapping) for r in rows]

    def forget_workers_before(self, cutoff: datetime) -> int:
        with write_transaction(self.engine) as conn:
            return conn.execute(delete(workers_table).where(workers_table.c.heartbeat_at < cutoff)).rowcount
