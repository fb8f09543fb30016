"""The scaled-out service on one machine: two API processes and three workers, each with a private data and
scratch directory, sharing nothing but PostgreSQL, Redis and moto's S3 server. A hundred jobs are submitted
round-robin over both APIs while a worker is killed with SIGKILL mid-job and started again: every job
succeeds, exactly one attempt of each is published, and every artifact downloads from both APIs with the
sha256 of what it must be (the engine here copies the model through, each job's model is different).
"""
from __future__ import annotations

import hashlib
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.service.server import ServiceProcess, free_port
from tests.waiting import wait_until
from worker.jobs.files import JobFiles
from worker.jobs.storage import open_storage
from worker.jobs.store import JobState, JobStore, metadata

JOBS = 100
DELAY_SECONDS = 0.3


def wait_for(predicate, timeout: float, what: str, processes=()):
    return wait_until(predicate, timeout, what, lambda: "\n".join(f"--- {p.command} {p.pid}:\n{p.log()}"
                                                                   for p in processes))


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def shared(postgres_url, redis_url, s3_bucket):
    """What the hosts share: the job table (emptied), a queue name on Redis, a bucket on the S3 server."""
    store = JobStore(postgres_url)
    with store.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    yield {"database_url": postgres_url, "redis_url": redis_url, "storage_url": f"s3://{s3_bucket}/multi",
           "queue_name": f"mirserve-multi-{secrets.token_hex(4)}"}, store
    store.dispose()


# Five service processes, moto, PostgreSQL and Redis at once: about a minute on an idle two-core machine, several
# on a busy one, so it runs with the model tests, not in the quick loop.
@pytest.mark.models
def test_two_apis_and_three_workers_share_only_the_database_queue_and_bucket(shared, tmp_path):
    settings, store = shared
    common = {**settings, "engine": "tests.service.engines:delayed", "test_engine_delay": DELAY_SECONDS,
              "lease_seconds": 3, "heartbeat_seconds": 0.5, "reaper_interval_seconds": 0.5,
              "job_memory_mb": 1024, "poll_seconds": 0.05,
              # the victim may die holding a message it took off the queue before claiming its job: the
              # reaper resends the message of a job queued this long (default 600 s, the test's whole wait)
              "requeue_after_seconds": 5,
              "job_nice": 0}  # the engine processes only sleep: at nice 10, other load on the machine starves them
    processes: list[ServiceProcess] = []
    began = time.monotonic()

    def host(name: str, command: list[str], **extra) -> ServiceProcess:
        data = tmp_path / name  # this host's own disk: its data directory and scratch, shared with no one
        process = ServiceProcess(command, {**common, "data_dir": data, "scratch_dir": data / "scratch", **extra},
                                 tmp_path / f"{name}.log")
        processes.append(process)
        return process

    try:
        workers = [host(f"worker{i}", ["worker", "--concurrency", "2"]) for i in range(3)]
        ports = [free_port(), free_port()]
        apis = [host(f"api{i}", ["api"], port=port) for i, port in enumerate(ports)]
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        wait_for(lambda: all(ready(url) for url in urls), 90, "both APIs to be ready", processes)
        wait_for(lambda: len(store.live_workers(3)) == 3, 90, "all three workers to be up", processes)
        print(f"up after {time.monotonic() - began:.1f} s")

        payloads = [f"model {i} ".encode() * 50 + secrets.token_bytes(64) for i in range(JOBS)]
        expected = [hashlib.sha256(p).hexdigest() for p in payloads]
        clients = [httpx.Client(base_url=url, timeout=60) for url in urls]

        def submit(i: int) -> str:
            response = clients[i % 2].post("/optimize", files={"model": (f"m{i}.onnx", payloads[i])},
                                           data={"places": "x86/fp32/nchw"})
            assert response.status_code == 202, response.text
            time.sleep(0.02)  # clients arrive over a few seconds, not all in one instant
            return response.json()["id"]

        victim = workers[0]

        def victim_running() -> bool:
            running = store.list(state=JobState.RUNNING, limit=100)[0]
            return any(f":{victim.pid}:" in (j.worker_id or "") and j.progress_total for j in running)

        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(submit, i) for i in range(JOBS)]
            # Kill a worker mid-job while the submissions go on, then start it again on its own disk.
            wait_for(victim_running, 60, "the victim worker to run a job", processes)
            victim.kill()
            killed_at = time.monotonic() - began
            submitted_at_kill = sum(f.done() for f in futures)
            victim.start()
            ids = [f.result() for f in futures]
        print(f"killed after {killed_at:.1f} s with {submitted_at_kill} submitted; all submitted after "
              f"{time.monotonic() - began:.1f} s")
        assert submitted_at_kill < JOBS, "the kill was meant to happen while jobs were still being submitted"

        def done() -> bool:
            counts = store.counts()
            return counts[JobState.SUCCEEDED] + counts[JobState.FAILED] + counts[JobState.CANCELED] == JOBS
        wait_for(done, 600, "every job to end", processes)
        print(f"all ended after {time.monotonic() - began:.1f} s")
        jobs = [store.get(job_id) for job_id in ids]
        assert [j.state for j in jobs] == [JobState.SUCCEEDED] * JOBS, [(j.id, j.error_message) for j in jobs
                                                                        if j.state is not JobState.SUCCEEDED]
        retried = [j for j in jobs if j.attempt > 1]
        assert retried, "the killed worker was running a job: it must have been retried"
        assert all("lease expired" in j.retry_reason for j in retried)

        bucket = JobFiles(open_storage(settings["storage_url"], tmp_path / "checker"))
        try:
            for job, sha in zip(jobs, expected):
                # Exactly one attempt published: the others' outputs are gone from the bucket.
                attempts = [n for n in bucket.storage.children(bucket.job_prefix(job.id)) if n.startswith("attempt-")]
                assert attempts == [f"attempt-{job.artifact_attempt}"], (job.id, attempts)
                assert job.artifact_sha256 == sha and job.cached_from is None
                for client in clients:
                    response = client.get(f"/jobs/{job.id}/artifact")
                    assert response.status_code == 200, response.text
                    assert hashlib.sha256(response.content).hexdigest() == sha
                    assert response.headers["etag"].strip('"') == sha
        finally:
            bucket.storage.close()
            for client in clients:
                client.close()
        # Nothing but the bucket holds a job's files: the hosts' disks keep no job.
        for process in processes:
            data = tmp_path / process.log_path.stem
            assert not list(data.glob("jobs/*")), f"{process.command} kept job files on its own disk"
        for api in apis:  # uvicorn ends by raising the signal again once it has shut down cleanly
            assert api.terminate() in (0, -signal.SIGTERM), api.log()
        for worker in workers:
            assert worker.terminate() == 0, worker.log()
    finally:
        for process in processes:
            process.kill()
