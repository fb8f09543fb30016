"""The job machinery end to end inside one process: worker threads, engine children, leases, the reaper.

The engine here is ``tests.service.engines:scripted`` (a real child process, a fake optimizer whose behaviour
the job's options script), so every outcome of a child can be produced on purpose. Each test runs on
SQLite + SqliteHuey + the data directory and on PostgreSQL + RedisHuey + S3 against the local servers, but
those about the engine process alone (``ENGINE_PROCESS_ONLY``) and those that need local files.
"""
from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

import pytest

from tests.service.conftest import make_config, new_job, upgraded_database
from tests.service.engines import recorded
from tests.waiting import wait_until
from worker.jobs.consumer import JobWorker
from worker.jobs.store import JobState, JobStore, jobs_table
from worker.jobs.db import write_transaction


@pytest.fixture(params=["sqlite+sqlite+local", "postgres+redis+s3"])
def backends(request, tmp_path):
    """The embedded set-up, and the scaled-out one: nothing shared but PostgreSQL, Redis and an S3 bucket."""
    if request.param == "sqlite+sqlite+local":
        return {"database_url": upgraded_database(f"sqlite:///{tmp_path / 'mirserve.db'}"), "redis_url": None}
    return {"database_url": request.getfixturevalue("postgres_url"),
            "redis_url": request.getfixturevalue("redis_url"),
            "storage_url": f"s3://{request.getfixturevalue('s3_bucket')}/runner-test"}


@pytest.fixture
def make_worker(backends, tmp_path):
    """Start embedded workers sharing one job table, one queue and one data directory."""
    started = []
    queue_name = f"mirserve-test-{os.getpid()}-{time.monotonic_ns()}"

    def start(**overrides) -> JobWorker:
        config = make_config(tmp_path / "data", queue_name=queue_name, **backends, **overrides)
        worker = JobWorker(config)
        if not started:
            _empty(worker.store)
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(timeout=5)
    if started:
        started[0].queue.flush()
        _empty(started[0].store)
        for worker in started:
            worker.store.dispose()


def _empty(store: JobStore) -> None:
    from worker.jobs.store import metadata

    with store.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())


def submit(worker: JobWorker, **options) -> str:
    job = new_job(worker.files, **options)
    worker.store.create(job)
    worker.queue.enqueue(job.id)
    return job.id


def finished(worker: JobWorker, job_id: str, timeout: float = 30.0):
    return wait_until(lambda: (j := worker.store.get(job_id)) and j.state.is_terminal and j, timeout,
                      f"job {job_id} to finish")


def running_with_child(worker: JobWorker, job_id: str):
    return wait_until(lambda: (j := worker.store.get(job_id)) and j.child_pid and j.progress_index and j, 30,
                      "the engine child to report progress")


def attempt_dirs(worker: JobWorker, job_id: str) -> list[str]:
    """The attempts with stored files."""
    return [n for n in worker.files.storage.children(worker.files.job_prefix(job_id)) if n.startswith("attempt-")]


def engine_record(worker: JobWorker, job_id: str, attempt: int, name: str) -> dict:
    return recorded(worker.files.storage.read_bytes(worker.files.log_key(job_id, attempt), 1 << 20), name)


def test_job_succeeds_with_progress_summary_and_one_published_attempt(make_worker):
    worker = make_worker()
    job_id = submit(worker, passes=4, payload_note="x")
    job = finished(worker, job_id)
    assert job.state is JobState.SUCCEEDED and job.attempt == 1
    assert (job.progress_index, job.progress_total, job.progress_pass) == (4, 4, "fake_pass_4")
    assert job.summary["passes_run"] == 4 and job.summary["verified"] is True
    artifact = worker.files.storage.read_bytes(worker.files.artifact_key(job_id, job.artifact_attempt), 100)
    assert artifact == b"not really a model" and job.artifact_bytes == len(b"not really a model")
    assert attempt_dirs(worker, job_id) == ["attempt-1"]
    wait_until(lambda: not worker.files.attempt_dir(job_id, 1).exists(), 5, "the scratch to be cleared")


def test_a_user_error_fails_the_job_at_once_with_its_message_and_field(make_worker):
    worker = make_worker()
    job = finished(worker, submit(worker, then="fail"))
    assert (job.state, job.attempt, job.error_type, job.error_field) == (JobState.FAILED, 1, "ModelError", "model")
    assert "not an ONNX model" in job.error_message


#: For tests of what happens in and to the engine process (its signals, limits, how it is started): the job
#: table, queue and storage only record the outcome, through the same store.fail() that
#: test_a_user_error_fails_the_job... runs on both backends; a second backend would prove nothing more.
ENGINE_PROCESS_ONLY = pytest.mark.parametrize("backends", ["sqlite+sqlite+local"], indirect=True)


@ENGINE_PROCESS_ONLY
def test_an_engine_crash_fails_the_job_naming_the_signal(make_worker):
    worker = make_worker()
    job = finished(worker, submit(worker, then="crash"))
    assert (job.state, job.attempt, job.error_type) == (JobState.FAILED, 1, "EngineCrash")
    assert "SIGABRT" in job.error_message


@ENGINE_PROCESS_ONLY
@pytest.mark.parametrize("warm", [True, False])
def test_every_job_gets_a_fresh_engine_process_forked_warm_or_started_cold(make_worker, warm):
    worker = make_worker(warm_engines=warm)
    first, second = (submit(worker, record_process=True) for _ in range(2))
    records = []
    for job_id in (first, second):
        assert finished(worker, job_id).state is JobState.SUCCEEDED
        records.append(engine_record(worker, job_id, 1, "process"))
    assert records[0]["pid"] != records[1]["pid"] and os.getpid() not in {r["pid"] for r in records}
    assert all(r["pgid"] == r["pid"] for r in records)  # each leads its own group, which a kill takes whole
    # Warm: forked from the fork server, which had imported the engine; cold: a new interpreter of the worker's.
    assert all(r["engine_loaded"] is warm and (r["ppid"] != os.getpid()) is warm for r in records)


@ENGINE_PROCESS_ONLY
def test_the_memory_limit_stops_a_hungry_engine_with_a_clear_error(make_worker):
    worker = make_worker(job_memory_mb=512)
    job = finished(worker, submit(worker, then="hog", hog_mb=1024))
    assert (job.state, job.error_type) == (JobState.FAILED, "ResourceLimitError")
    assert "job limit of 512 MiB" in job.error_message


@ENGINE_PROCESS_ONLY
def test_the_time_limit_kills_a_slow_engine(make_worker):
    worker = make_worker(job_time_limit_seconds=0.5)
    job_id = submit(worker, passes=1, pass_seconds=30)
    pid = running_with_child(worker, job_id).child_pid
    job = finished(worker, job_id, timeout=10)
    assert (job.state, job.error_type) == (JobState.FAILED, "TimeLimitError")
    assert "time limit of 0.5 s" in job.error_message
    assert not _alive(pid)


def test_cancel_kills_the_running_engine(make_worker):
    worker = make_worker()
    job_id = submit(worker, passes=1, pass_seconds=30)
    pid = running_with_child(worker, job_id).child_pid
    worker.store.request_cancel(job_id)
    job = finished(worker, job_id, timeout=10)
    assert job.state is JobState.CANCELED and job.artifact_sha256 is None
    assert not _alive(pid)


def test_an_engine_killed_from_outside_is_retried_and_succeeds(make_worker):
    worker = make_worker()
    job_id = submit(worker, passes=3, pass_seconds=30)
    pid = running_with_child(worker, job_id).child_pid
    _quicken(worker.store, job_id)  # the retry may be quick (the running engine has its options already)
    os.kill(pid, signal.SIGKILL)
    job = finished(worker, job_id)
    assert (job.state, job.attempt, job.artifact_attempt) == (JobState.SUCCEEDED, 2, 2)
    assert "killed by SIGKILL" in job.retry_reason
    # The other attempts' files go right after the publishing commit (never before: a stale attempt must not
    # delete the live one's), so they may still be there for a moment when the job reads succeeded.
    wait_until(lambda: attempt_dirs(worker, job_id) == ["attempt-2"], 5, "the killed attempt's files to go")


def test_an_attempt_that_lost_its_lease_never_publishes(make_worker):
    """The reaper gives the job to another worker while the first still runs: only the second publishes."""
    # The lease is expired by hand; a long one keeps a loaded machine's late heartbeat from reaping attempt 2,
    # and the first worker's own reaper is slowed so that the test's reap is the one that takes the job back
    # (every 0.1 s it raced the test: the job was reaped, and queued with attempt 2 holding, before the test).
    first = make_worker(lease_seconds=30.0, reaper_interval_seconds=600.0)
    job_id = submit(first, passes=4, hold=60)  # attempt 1 runs until it is killed
    stale = running_with_child(first, job_id)
    _expire_lease(first.store, job_id)
    assert [r.job_id for r in first.store.reap_expired()] == [job_id]
    _quicken(first.store, job_id)  # attempt 2 does not hold
    first.queue.enqueue(job_id)
    second = make_worker(lease_seconds=30.0)
    job = finished(second, job_id)
    assert (job.state, job.attempt, job.artifact_attempt) == (JobState.SUCCEEDED, 2, 2)
    # The first attempt notices at its next heartbeat and kills its engine, which would otherwise hold 60 s.
    wait_until(lambda: not _alive(stale.child_pid), 10, "the stale attempt to kill its engine")
    assert first.store.get(job_id).artifact_attempt == 2
    wait_until(lambda: attempt_dirs(first, job_id) == ["attempt-2"], 10, "the stale attempt's files to go")


def test_stopping_a_worker_gives_its_running_job_back(make_worker):
    first = make_worker()
    job_id = submit(first, passes=1, pass_seconds=30)
    pid = running_with_child(first, job_id).child_pid
    first.stop(timeout=5)
    assert not _alive(pid)
    assert first.store.get(job_id).state is JobState.QUEUED
    _quicken(first.store, job_id)  # let the second run go quickly
    second = make_worker()
    job = finished(second, job_id)
    assert (job.state, job.attempt) == (JobState.SUCCEEDED, 2)
    assert "shut down" in job.retry_reason


def test_a_lost_queue_message_is_sent_again(make_worker):
    worker = make_worker(requeue_after_seconds=0.1)
    job = new_job(worker.files)
    worker.store.create(job)  # in the table, but no message in the queue
    assert finished(worker, job.id, timeout=15).state is JobState.SUCCEEDED


def test_retention_removes_old_finished_jobs_with_their_files(make_worker):
    worker = make_worker(retention_hours=1.0)
    job_id = submit(worker)
    finished(worker, job_id)
    with write_transaction(worker.store.engine) as conn:
        conn.execute(jobs_table.update().where(jobs_table.c.id == job_id)
                     .values(finished_at=worker.store.clock() - timedelta(hours=2)))
    wait_until(lambda: worker.store.get(job_id) is None, 10, "the old job to be purged")
    wait_until(lambda: worker.files.storage.children(worker.files.job_prefix(job_id)) == [], 10, "its files to go")


@pytest.mark.parametrize("backends", ["sqlite+sqlite+local"], indirect=True)  # S3 objects cannot be aged
def test_abandoned_uploads_orphan_files_and_dead_workers_scratch_are_swept(make_worker):
    worker = make_worker()
    storage, old = worker.files.storage, time.time() - 7200
    abandoned = storage.writer("jobs/dying-upload/input.onnx")  # an API process died mid-upload
    abandoned.write(b"half an upload")
    arriving = storage.writer("jobs/arriving/input.onnx")  # an upload in progress right now
    arriving.write(b"the first bytes")
    storage.put_bytes("jobs/orphan-job/input.onnx", b"a model whose row never came")
    dead_scratch = worker.files.scratch.parent / "host:1:dead"  # a worker killed mid-job
    (dead_scratch / "some-job" / "attempt-1").mkdir(parents=True)
    for path in (abandoned.partial, storage.path("jobs/orphan-job/input.onnx"), storage.path("jobs/orphan-job"),
                 dead_scratch):
        os.utime(path, (old, old))
    assert worker.reaper.run_once(sweep=True).leftovers == 3
    assert not abandoned.partial.exists() and storage.children("jobs/") == ["arriving"] and not dead_scratch.exists()
    assert arriving.partial.exists() and worker.files.scratch.parent.is_dir()


def _quicken(store: JobStore, job_id: str) -> None:
    """The job's next attempt runs one pass without waiting (an attempt already running keeps its options)."""
    with write_transaction(store.engine) as conn:
        conn.execute(jobs_table.update().where(jobs_table.c.id == job_id)
                     .values(spec={"places": "x86/fp32/nchw", "options": {"passes": 1}}))


def _expire_lease(store: JobStore, job_id: str) -> None:
    with write_transaction(store.engine) as conn:
        conn.execute(jobs_table.update().where(jobs_table.c.id == job_id)
                     .values(lease_expires_at=store.clock() - timedelta(seconds=1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("backends", ["sqlite+sqlite+local"], indirect=True)  # other jobs' files to reach for
def test_the_engine_process_reaches_only_its_input_and_its_attempt_directory(make_worker, tmp_path):
    """Its working directory, HOME and TMPDIR are its attempt's; with Landlock, nothing else of the data dir."""
    from worker.jobs.sandbox import landlock_version

    worker = make_worker()
    data, storage = worker.config.data_dir, worker.files.storage
    other = new_job(worker.files, payload=b"another user's model")
    worker.store.create(other)  # never queued: its files just sit there
    secrets_file, outside = data / "secret.txt", tmp_path / "outside.txt"
    for path in (secrets_file, outside):
        path.write_bytes(b"secret")
    job = new_job(worker.files)
    own_input = str(storage.path(worker.files.input_key(job.id)))
    other_input = str(storage.path(worker.files.input_key(other.id)))
    jobs_dir = storage.path("jobs")
    job.spec.options.update(then="probe", probe_read=[own_input, other_input, str(secrets_file), str(outside)],
                            probe_write=[str(data / "evil.txt"), str(jobs_dir / job.id / "evil.txt"),
                                         "relative.txt"],
                            probe_list=[str(data), str(jobs_dir)])
    worker.store.create(job)
    worker.queue.enqueue(job.id)
    done = finished(worker, job.id)
    assert done.state is JobState.SUCCEEDED, done.error_message
    attempt = worker.files.attempt_dir(job.id, 1)
    found = engine_record(worker, job.id, 1, "probe")
    assert found["cwd"] == str(attempt) and found["relative"] == str(attempt / "relative.txt")
    assert found["home"].startswith(str(attempt) + "/") and found["tmpdir"].startswith(str(attempt) + "/")
    assert found["write"]["relative.txt"] == "ok"
    assert found["read"][own_input] == "ok" and found["child_read"][own_input] == "ok"
    if landlock_version() == 0:
        pytest.skip("this kernel has no Landlock: the engine process is fenced in by its working directory only")
    for path in (other_input, str(secrets_file), str(outside)):
        assert found["read"][path] == "PermissionError" and found["child_read"][path] == "PermissionError", path
    assert set(found["write"].values()) == {"ok", "PermissionError"}
    assert found["write"][str(data / "evil.txt")] == "PermissionError" and not (data / "evil.txt").exists()
    assert found["list"] == {str(data): "PermissionError", str(jobs_dir): "PermissionError"}


@pytest.mark.parametrize("warm", ["warm", "cold"])
def test_an_engine_process_does_not_import_the_parents_main_module_again(tmp_path, warm):
    """Under ``python -m app.cli worker`` the main module is the whole HTTP app: importing it again in every
    engine process cost each job about a second."""
    import json
    import subprocess
    import sys

    from tests.service.server import REPO

    done = subprocess.run([sys.executable, "-m", "tests.service.start_engine", str(tmp_path), warm], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    main_file = json.loads(done.stdout)["main_file"]
    assert main_file is None or not main_file.endswith("start_engine.py"), main_file
