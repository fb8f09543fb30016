"""The job table's contract, run on SQLite and on the local PostgreSQL server (the ``store`` fixture)."""
from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from tests.service.conftest import new_job
from worker.jobs.store import IdempotencyConflict, JobState, JobStore


class Clock:
    """A settable clock, so lease expiry is tested without sleeping."""

    def __init__(self):
        self.now = datetime(2025, 1, 1, tzinfo=timezone.utc)

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock(store):
    store.clock = Clock()
    return store.clock


def test_created_job_is_queued_with_its_upload_facts(store):
    job = store.create(new_job(opt_level=1))
    assert job.state is JobState.QUEUED and job.attempt == 0
    assert job.spec.options == {"opt_level": 1} and job.spec.places == "x86/fp32/nchw"
    assert job == store.get(job.id) and job.input_filename == "model.onnx"
    assert job.created_at.tzinfo is not None and job.enqueued_at == job.created_at


def test_unknown_job_is_none(store):
    assert store.get("no-such-job") is None


def test_list_is_newest_first_paginated_and_filtered(store, clock):
    ids = []
    for _ in range(5):
        ids.append(store.create(new_job()).id)
        clock.advance(1)
    store.request_cancel(ids[1])
    page, total = store.list(limit=2)
    assert total == 5 and [j.id for j in page] == [ids[4], ids[3]]
    page, total = store.list(limit=2, offset=4)
    assert [j.id for j in page] == [ids[0]]
    page, total = store.list(state=JobState.CANCELED)
    assert total == 1 and page[0].id == ids[1]
    assert store.counts()[JobState.QUEUED] == 4


def test_claim_is_won_by_exactly_one_of_many_racing_workers(store):
    job = store.create(new_job())
    won, barrier = [], threading.Barrier(6)

    def race(i):
        barrier.wait()
        claimed = store.claim(job.id, f"worker-{i}", 30)
        if claimed is not None:
            won.append(claimed)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and won[0].attempt == 1
    assert won[0] == store.get(job.id) and won[0].state is JobState.RUNNING and won[0].worker_id.startswith("worker-")


def test_heartbeat_records_progress_and_reports_cancel(store):
    job = store.create(new_job())
    lease = store.claim(job.id, "w", 30).lease
    beat = store.heartbeat(lease, 30, (3, 7, "conv_bn_fuse"))
    assert beat.owned and not beat.cancel_requested
    stored = store.get(job.id)
    assert (stored.progress_index, stored.progress_total, stored.progress_pass) == (3, 7, "conv_bn_fuse")
    assert store.request_cancel(job.id).state is JobState.RUNNING  # a running job is only flagged
    assert store.heartbeat(lease, 30).cancel_requested
    assert store.cancel(lease) and store.get(job.id).state is JobState.CANCELED


def test_publish_happens_once_and_only_under_the_current_lease(store, clock):
    job = store.create(new_job())
    first = store.claim(job.id, "w1", 10).lease
    clock.advance(11)
    assert [r.state for r in store.reap_expired()] == [JobState.QUEUED]
    second = store.claim(job.id, "w2", 10).lease
    assert second.attempt == 2
    assert not store.heartbeat(first, 10).owned
    assert not store.publish(first, artifact_bytes=1, artifact_sha256="a" * 64, summary={})
    assert store.publish(second, artifact_bytes=2, artifact_sha256="b" * 64, summary={"rewrites": 1})
    assert not store.publish(second, artifact_bytes=3, artifact_sha256="c" * 64, summary={})
    done = store.get(job.id)
    assert (done.state, done.artifact_attempt, done.artifact_sha256) == (JobState.SUCCEEDED, 2, "b" * 64)
    assert done.summary == {"rewrites": 1} and done.lease_token is None


def test_retry_requeues_until_attempts_run_out_then_fails_with_the_reason(store):
    job = store.create(new_job(max_attempts=2))
    lease = store.claim(job.id, "w", 30).lease
    assert store.retry(lease, "the engine process was killed by SIGKILL") is JobState.QUEUED
    assert store.get(job.id).retry_reason == "attempt 1: the engine process was killed by SIGKILL"
    lease = store.claim(job.id, "w", 30).lease
    assert store.retry(lease, "the engine process was killed by SIGKILL") is JobState.FAILED
    failed = store.get(job.id)
    assert failed.state is JobState.FAILED and failed.error_type == "AttemptsExhausted"
    assert "killed by SIGKILL" in failed.error_message and "2 attempt(s)" in failed.error_message


def test_reaper_leaves_a_renewed_lease_alone(store, clock):
    job = store.create(new_job())
    lease = store.claim(job.id, "w", 10).lease
    clock.advance(5)
    store.heartbeat(lease, 10)
    clock.advance(8)  # 13 s after the claim, 8 s after the renewal
    assert store.reap_expired() == []
    assert store.get(job.id).state is JobState.RUNNING


def test_reaping_an_expired_canceled_job_finishes_the_cancel(store, clock):
    job = store.create(new_job())
    store.claim(job.id, "w", 10)
    store.request_cancel(job.id)
    clock.advance(11)
    assert [r.state for r in store.reap_expired()] == [JobState.CANCELED]


def test_claim_refuses_canceled_and_deleted_jobs(store):
    canceled = store.create(new_job())
    store.request_cancel(canceled.id)
    assert store.claim(canceled.id, "w", 30) is None
    deleted = store.create(new_job())
    assert store.delete(deleted.id)
    assert store.claim(deleted.id, "w", 30) is None


def test_delete_refuses_a_running_job(store):
    job = store.create(new_job())
    store.claim(job.id, "w", 30)
    assert not store.delete(job.id, unless_state=[JobState.RUNNING])
    assert store.get(job.id) is not None


def test_idempotency_key_is_unique(store):
    first = store.create(replace(new_job(), idempotency_key="k1"))
    with pytest.raises(IdempotencyConflict) as raised:
        store.create(replace(new_job(), idempotency_key="k1"))
    assert raised.value.existing.id == first.id


def test_stale_queued_jobs_are_touched_once(store, clock):
    job = store.create(new_job())
    clock.advance(100)
    assert store.touch_stale_queued(60) == [job.id]
    assert store.touch_stale_queued(60) == []  # enqueued_at moved: not stale any more


def test_worker_heartbeats_are_listed_while_fresh(store, clock):
    store.worker_beat("w1", hostname="h", pid=1, concurrency=2, running=1)
    assert [w["id"] for w in store.live_workers(10)] == ["w1"]
    clock.advance(11)
    assert store.live_workers(10) == []
    store.worker_gone("w1")
    assert store.forget_workers_before(clock()) == 0


def test_two_stores_on_one_database_see_each_other(store):
    other = JobStore(store.url)
    try:
        job = other.create(new_job())
        assert store.get(job.id).id == job.id
    finally:
        other.dispose()
