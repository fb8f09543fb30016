"""Backpressure and shutdown: a full queue refuses submissions with 503 and Retry-After before reading them;
SIGTERM on a real worker process stops it claiming, lets running jobs finish within the grace period, and
releases the leases of those still running after it, so that another worker runs them at once.
"""
from __future__ import annotations

import signal
import sys
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.service.conftest import FAKE_ENGINE, make_config, new_job, upgraded_database
from tests.service.engines import release
from tests.service.server import ServiceProcess
from tests.service.test_api import assert_problem, leftovers, post_model, wait_done
from tests.waiting import wait_until
from worker.jobs.consumer import JobWorker
from worker.jobs.db import write_transaction
from worker.jobs.files import JobFiles
from worker.jobs.queue import JobQueue
from worker.jobs.storage import open_storage
from worker.jobs.store import JobState, JobStore, jobs_table


def test_a_full_queue_refuses_submissions_with_retry_after_and_keeps_nothing(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", max_upload_mb=0.5, engine=FAKE_ENGINE, lease_seconds=3,
                        heartbeat_seconds=0.3, reaper_interval_seconds=0.5, job_memory_mb=1024, max_queued=2)
    upgraded_database(settings.effective_database_url)
    with TestClient(create_app(settings)) as client:
        accepted = [post_model(client, options={"opt_level": level}).json() for level in (1, 2)]
        assert [job["status"] for job in accepted] == ["queued", "queued"]
        refused = post_model(client, options={"opt_level": 0})
        body = assert_problem(refused, 503)
        assert body["type"] == "/problems/queue-full" and (body["queued"], body["max_queued"]) == (2, 2)
        assert "MIRSERVE_MAX_QUEUED=2" in body["detail"]
        assert refused.headers["retry-after"] == "10"
        assert sorted({path.split("/")[0] for path in leftovers(settings)}) == sorted(j["id"] for j in accepted)
        assert client.get("/jobs").json()["total"] == 2
        assert client.get("/problems/queue-full").status_code == 200
        worker = JobWorker(settings)  # a worker empties the queue: submissions are taken again
        worker.start()
        try:
            for job in accepted:
                assert wait_done(client, job["id"])["status"] == "succeeded"
            assert post_model(client, options={"opt_level": 0}).status_code == 202
        finally:
            worker.stop(timeout=5)


def worker_process(config, log_path, **settings) -> ServiceProcess:
    """``mirserve worker`` as a real process on the test's settings."""
    shared = {name: getattr(config, name) for name in (
        "data_dir", "database_url", "queue_name", "engine", "lease_seconds", "heartbeat_seconds",
        "reaper_interval_seconds", "job_memory_mb", "poll_seconds")}
    return ServiceProcess(["worker"], {**shared, **settings}, log_path)


@pytest.fixture
def cluster(tmp_path):
    """A job table and queue on SQLite, real worker processes started on them (killed at the end), and
    ``successor``: another worker on them, embedded in this process.

    The worker under test is always a real process (it is the one signalled). The successor only has to be
    some other worker that takes what the first left or gave back; embedded, it starts in milliseconds on this
    process's warm fork server, where a second ``mirserve worker`` cost a second of imports and its fork
    server's warm-up on every test."""
    config = make_config(tmp_path / "data", lease_seconds=30.0, heartbeat_seconds=0.5)
    upgraded_database(config.effective_database_url)
    store, queue = JobStore(config.effective_database_url), JobQueue.connect(config)
    files = JobFiles(open_storage(None, config.data_dir))
    started: list[ServiceProcess] = []
    embedded: list[JobWorker] = []

    def start(**settings) -> ServiceProcess:
        worker = worker_process(config, tmp_path / f"worker-{len(started)}.log", **settings)
        started.append(worker)
        return worker

    def successor() -> JobWorker:
        worker = JobWorker(config)
        worker.start()
        embedded.append(worker)
        return worker

    def submit(max_attempts: int = 3, **options) -> str:
        job = new_job(files, max_attempts=max_attempts, **options)
        store.create(job)
        queue.enqueue(job.id)
        return job.id

    yield SimpleNamespace(store=store, start=start, successor=successor, submit=submit)
    for worker in started:
        worker.kill()
    for worker in embedded:
        worker.stop(timeout=5)
    queue.flush()
    queue.close()
    store.dispose()


def running(store: JobStore, job_id: str, worker: ServiceProcess):
    return wait_until(lambda: (j := store.get(job_id)) and j.child_pid and j.progress_index and j, 60,
                      f"job {job_id} to run", worker.log)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_lets_a_running_job_finish_and_claims_nothing_more(cluster):
    store, start, submit = cluster.store, cluster.start, cluster.submit
    worker = start(shutdown_grace_seconds=30)
    job_id = submit(passes=3, hold=60)  # runs until released below
    pid = running(store, job_id, worker).child_pid
    worker.process.send_signal(signal.SIGTERM)
    later = submit(passes=1)  # sent while the worker drains: it must not take it
    wait_until(lambda: "draining" in worker.log(), 20, "the worker to drain", worker.log)
    release(pid)  # the running job finishes now, within the grace period
    assert worker.process.wait(30) == 0, worker.log()
    job = store.get(job_id)
    assert (job.state, job.attempt) == (JobState.SUCCEEDED, 1), worker.log()
    waiting = store.get(later)
    assert (waiting.state, waiting.attempt) == (JobState.QUEUED, 0), worker.log()
    cluster.successor()  # the message the draining worker did not take is still there for another
    wait_until(lambda: store.get(later).state is JobState.SUCCEEDED, 30, "the later job to run")


def test_after_the_grace_period_running_jobs_are_released_to_another_worker_at_once(cluster):
    store, start, submit = cluster.store, cluster.start, cluster.submit
    worker = start(shutdown_grace_seconds=0.5)
    job_id = submit(max_attempts=1, passes=1, pass_seconds=60)
    pid = running(store, job_id, worker).child_pid
    signalled = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(20) == 0, worker.log()
    assert time.monotonic() - signalled < 10
    assert not alive(pid)
    job = store.get(job_id)
    # Released, not failed, though its one attempt is spent: the shutdown was not the job's fault. Its lease
    # (30 s here) is gone now, not when it would have expired.
    assert job.state is JobState.QUEUED and job.lease_token is None and job.worker_id is None, worker.log()
    assert "shut down" in job.retry_reason and "still running after the grace period" in worker.log()
    with write_transaction(store.engine) as conn:  # the next run may be quick
        conn.execute(jobs_table.update().where(jobs_table.c.id == job_id)
                     .values(spec={"places": "x86/fp32/nchw", "options": {"passes": 1}}))
    released = time.monotonic()
    cluster.successor()
    wait_until(lambda: store.get(job_id).state is JobState.SUCCEEDED, 30, "another worker to run it")
    assert time.monotonic() - released < 25  # well before the 30 s lease would have run out
    assert store.get(job_id).attempt == 2


def test_a_second_signal_ends_the_grace_period(cluster):
    store, start, submit = cluster.store, cluster.start, cluster.submit
    worker = start(shutdown_grace_seconds=120)
    job_id = submit(passes=1, pass_seconds=60)
    running(store, job_id, worker)
    worker.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining" in worker.log(), 20, "the worker to drain", worker.log)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(20) == 0, worker.log()
    assert store.get(job_id).state is JobState.QUEUED


def test_the_stop_signal_handler_takes_no_lock(tmp_path):
    """A handler runs in the main thread between two of its bytecodes, maybe inside a critical section of the
    lock it would take: a worker whose handler called Event.set() on the event its main thread waited on hung
    for good on SIGTERM. Every lock taken while the handler runs is recorded (a C call on a lock object)."""
    config = make_config(tmp_path / "data", database_url=upgraded_database(f"sqlite:///{tmp_path / 'jobs.db'}"))
    worker = JobWorker(config)
    taken = []

    def profile(frame, event, arg):
        if event == "c_call" and type(getattr(arg, "__self__", None)).__module__ == "_thread":
            taken.append(arg.__qualname__)

    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            sys.setprofile(profile)
            try:
                worker.on_signal(signum, None)
            finally:
                sys.setprofile(None)
        assert taken == []
        assert worker._signals == 2  # the main loop drains after the first and stops draining after the second
    finally:
        worker.store.dispose()
        worker.files.storage.close()
