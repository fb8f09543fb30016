"""A job's engine runs under the engine's limits, with verification's budgets taken from the job's own."""
from __future__ import annotations

from worker.engine.limits import Limits
from worker.jobs.engine import job_limits


def test_verification_gets_a_share_of_the_job_time_and_the_job_memory(monkeypatch):
    monkeypatch.setenv("MIRSERVE_JOB_TIME_LIMIT_SECONDS", "90")
    monkeypatch.setenv("MIRSERVE_JOB_MEMORY_MB", "2048")
    limits = job_limits(Limits())
    assert (limits.verify_seconds, limits.verify_memory_mb) == (15.0, 2048)
    assert limits.max_tensor_mb == Limits().max_tensor_mb  # every other limit is the engine's default
    monkeypatch.setenv("MIRSERVE_JOB_MEMORY_MB", "0")  # no job cap: verification keeps the engine's own
    assert job_limits(Limits()).verify_memory_mb == Limits().verify_memory_mb
