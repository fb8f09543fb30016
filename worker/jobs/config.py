"""Settings the job machinery needs, as a plain dataclass so that the engine side never imports the web layer.

The service builds one from its pydantic settings (``app.settings.Settings.job_config``); tests build one directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_ENGINE = "worker.jobs.engine:run_optimize"


@dataclass(frozen=True)
class JobConfig:
    data_dir: Path
    database_url: str
    redis_url: str | None = None
    queue_name: str = "mirserve"
    #: "module:function" run in the child for each job: (model_path, output_path, options, progress) -> report.
    engine: str = DEFAULT_ENGINE
    concurrency: int = 1
    max_attempts: int = 3
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 5.0
    job_memory_mb: int = 4096
    job_time_limit_seconds: float = 900.0
    job_nice: int = 10
    reaper_interval_seconds: float = 5.0
    requeue_after_seconds: float = 600.0
    retention_hours: float = 168.0
    poll_seconds: float = 0.25

    def __post_init__(self):
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError(
                f"the heartbeat interval ({self.heartbeat_seconds} s) must be shorter than the lease "
                f"({self.lease_seconds} s), or every running job would be reaped")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
