"""The service's settings: one class, read from ``MIRSERVE_*`` environment variables (README: Configuration)."""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.jobs.config import DEFAULT_ENGINE, JobConfig


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MIRSERVE_", extra="ignore", frozen=True)

    data_dir: Path = Field(Path("data"), description="uploads, artifacts, the SQLite database and queue")
    database_url: str | None = Field(None, description="SQLAlchemy URL of the job table; default SQLite in data_dir")
    redis_url: str | None = Field(None, description="use RedisHuey on this server instead of SqliteHuey")
    queue_name: str = "mirserve"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    log_level: str = "info"
    max_upload_mb: float = Field(512.0, gt=0, description="uploads above this get 413")
    worker_concurrency: int = Field(1, ge=1, le=64, description="jobs one worker process runs at once")
    max_attempts: int = Field(3, ge=1, le=20)
    lease_seconds: float = Field(30.0, gt=0)
    heartbeat_seconds: float = Field(5.0, gt=0)
    job_memory_mb: int = Field(4096, ge=0, description="address-space limit of the engine process; 0: none")
    job_time_limit_seconds: float = Field(900.0, gt=0)
    job_nice: int = Field(10, ge=0, le=19)
    reaper_interval_seconds: float = Field(5.0, gt=0)
    requeue_after_seconds: float = Field(600.0, gt=0)
    retention_hours: float = Field(168.0, ge=0, description="finished jobs are deleted after this; 0: never")
    engine: str = Field(DEFAULT_ENGINE, description="module:function the engine process calls for each job")

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> "Settings":
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError(f"MIRSERVE_HEARTBEAT_SECONDS ({self.heartbeat_seconds}) must be smaller than "
                             f"MIRSERVE_LEASE_SECONDS ({self.lease_seconds})")
        return self

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'mirserve.db'}"

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * (1 << 20))

    @cached_property
    def job_config(self) -> JobConfig:
        return JobConfig(
            data_dir=self.data_dir.resolve(), database_url=self.effective_database_url, redis_url=self.redis_url,
            queue_name=self.queue_name, engine=self.engine, concurrency=self.worker_concurrency,
            max_attempts=self.max_attempts, lease_seconds=self.lease_seconds,
            heartbeat_seconds=self.heartbeat_seconds, job_memory_mb=self.job_memory_mb,
            job_time_limit_seconds=self.job_time_limit_seconds, job_nice=self.job_nice,
            reaper_interval_seconds=self.reaper_interval_seconds,
            requeue_after_seconds=self.requeue_after_seconds, retention_hours=self.retention_hours)
