"""Killing things mid-job on a real ``serve`` process tree with the real engine (held back at its first pass so
the kill surely lands mid-run): the job still succeeds on a later attempt, nothing stays running, and the
artifact is published once.
"""
from __future__ import annotations

import hashlib
import os
import signal

import pytest

from tests.conftest import CORPUS, CORPUS_SHAPES
from tests.service.server import Server
from tests.waiting import wait_until

MODEL = "ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["MIRSERVE_TEST_ENGINE_DELAY"] = "2"  # read by the engine child, inherited through serve
    # a lease of 8 s: short enough that a killed worker's job is reaped soon, long enough that heartbeats on a
    # loaded machine (the suite's two processes and more) keep the retry's own lease (3 s lost it once)
    try:
        with Server(tmp_path_factory.mktemp("kill") / "data", engine="tests.service.engines:slow_optimize",
                    lease_seconds=8, heartbeat_seconds=0.5, reaper_interval_seconds=0.5) as running:
            yield running
    finally:
        del os.environ["MIRSERVE_TEST_ENGINE_DELAY"]


def submit_and_wait_running(server: Server) -> str:
    response = server.submit(CORPUS / MODEL, "arm/fp32/nchw", {"input_shapes": CORPUS_SHAPES[MODEL]})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    wait_until(lambda: (row := server.job_row(job_id)).state.value == "running" and row.child_pid
               and row.progress_index, 30, f"job {job_id} to reach its first pass", server.log)
    return job_id


def assert_succeeded_once_on_a_later_attempt(server: Server, job_id: str) -> dict:
    job = server.wait_for(job_id, timeout=90)
    assert job["status"] == "succeeded", (job["error"], server.log())
    assert job["attempt"] == 2 and job["retry_reason"].startswith("attempt 1: "), (job["attempt"],
                                                                                     job["retry_reason"])
    assert server.client.get("/jobs", params={"status": "running"}).json()["total"] == 0
    row = server.job_row(job_id)
    assert row.artifact_attempt == 2 and row.lease_token is None
    job_dir = server.data_dir / "jobs" / job_id
    assert sorted(p.name for p in job_dir.glob("attempt-*")) == ["attempt-2"]
    artifact = server.client.get(job["links"]["artifact"]).content
    assert hashlib.sha256(artifact).hexdigest() == job["artifact"]["sha256"] == row.artifact_sha256
    return job


def wait_gone(pid: int, timeout: float = 10) -> None:
    wait_until(lambda: _gone(pid), timeout, f"process {pid} to end")


def _gone(pid: int) -> bool:
    """The process has ended (a zombie has: only its parent's wait is left)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"
    except (ProcessLookupError, FileNotFoundError):
        return True


def test_killing_the_engine_child_mid_job_retries_and_succeeds(server):
    job_id = submit_and_wait_running(server)
    os.kill(server.job_row(job_id).child_pid, signal.SIGKILL)
    job = assert_succeeded_once_on_a_later_attempt(server, job_id)
    assert "killed by SIGKILL" in job["retry_reason"]


def test_killing_the_whole_worker_mid_job_retries_and_succeeds(server):
    job_id = submit_and_wait_running(server)
    row = server.job_row(job_id)
    worker_pid = int(row.worker_id.split(":")[1])
    assert worker_pid != server.process.pid  # the embedded worker is its own process
    os.kill(worker_pid, signal.SIGKILL)
    wait_gone(row.child_pid)  # the engine child dies with its worker
    job = assert_succeeded_once_on_a_later_attempt(server, job_id)
    assert "stopped sending heartbeats" in job["retry_reason"]
    assert int(server.job_row(job_id).worker_id.split(":")[1]) != worker_pid  # serve restarted its worker
    server.wait_ready(timeout=10)
