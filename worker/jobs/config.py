"""The job side's settings, read from ``MIRSERVE_*`` environment variables (README: Configuration).

``JobSettings`` holds what a worker needs; the API's settings (``app.settings.Settings``) extend it with what
only the HTTP side uses, so every setting is declared once and both processes read the same variables.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Mapping, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from worker.jobs.archive import ArchiveLimits

DEFAULT_ENGINE = "worker.jobs.engine:run_optimize"

SettingsT = TypeVar("SettingsT", bound="JobSettings")


class JobSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MIRSERVE_", extra="ignore", frozen=True)

    data_dir: Path = Field(Path("data"), description="uploads, artifacts, the SQLite database and queue")
    database_url: str | None = Field(None, description="SQLAlchemy URL of the job table; default SQLite in data_dir")
    redis_url: str | None = Field(None, description="use RedisHuey on this server instead of SqliteHuey")
    storage_url: str | None = Field(None, description="s3://bucket/prefix for uploads, artifacts and reports; "
                                    "default: the data directory")
    storage_redirect: bool = Field(False, description="downloads answer 307 to a presigned URL of the store")
    scratch_dir: Path | None = Field(None, description="where engine processes work; default <data_dir>/scratch")
    queue_name: str = "mirserve"
    log_level: str = "info"
    log_format: Literal["json", "text"] = Field("json", description="one JSON object per line, or plain text")
    engine: str = Field(DEFAULT_ENGINE, description="module:function the engine process calls for each job")
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
    poll_seconds: float = Field(0.25, gt=0, le=5, description="how long a runner waits for engine output at once")
    queue_wait_seconds: float = Field(1.0, gt=0, le=30, description="how long an idle worker thread waits on Redis "
                                      "for a message before it looks whether it should stop; a worker stops within it")
    shutdown_grace_seconds: float = Field(20.0, ge=0, description="on SIGTERM a worker claims no more jobs and "
                                          "lets running ones finish for this long, then gives the rest back to "
                                          "the queue at once")
    cache: bool = Field(True, description="a job whose model, places and options an earlier job already "
                        "optimized with the same engine reuses that result; false: every job runs")
    max_unpacked_mb: int = Field(4096, ge=1, description="bytes an archive upload may unpack to, all members "
                                 "together")
    warm_engines: bool = Field(True, description="fork each job's engine process from a server that has imported "
                               "the engine; false: a fresh interpreter per job")

    @field_validator("data_dir", "scratch_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Resolved once, here: the engine processes run in their own directories, so a relative path would
        # name something else there.
        return value.expanduser().resolve() if value is not None else None

    @field_validator("storage_url")
    @classmethod
    def _storage_url(cls, value: str | None) -> str | None:
        if value and (not value.startswith("s3://") or not value[len("s3://"):].split("/")[0]):
            raise ValueError(f"must be s3://bucket/prefix (or unset for the data directory), not {value!r}")
        return value or None

    callback_allow: str = Field("", description="hosts (host or host:port, comma-separated) that job callbacks "
                                                 "may call; empty: callbacks are refused")
    callback_secret: SecretStr | None = Field(None, description="the HMAC-SHA256 key that signs every callback")

    @property
    def callback_hosts(self) -> list[str]:
        return [h.strip() for h in self.callback_allow.split(",") if h.strip()]

    @model_validator(mode="after")
    def _callbacks_are_signed(self):
        if self.callback_hosts and not self.callback_secret:
            raise ValueError("MIRSERVE_CALLBACK_SECRET must be set when MIRSERVE_CALLBACK_ALLOW names hosts: "
                             "every callback is signed with it")
        return self

    @model_validator(mode="after")
    def _heartbeat_within_lease(self):
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError(f"MIRSERVE_HEARTBEAT_SECONDS ({self.heartbeat_seconds}) must be smaller than "
                             f"MIRSERVE_LEASE_SECONDS ({self.lease_seconds}), or every running job would be reaped")
        return self

    @property
    def archive_limits(self) -> "ArchiveLimits":
        from worker.jobs.archive import ArchiveLimits

        return ArchiveLimits(max_unpacked_bytes=self.max_unpacked_mb << 20)

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'mirserve.db'}"

    @property
    def scratch_root(self) -> Path:
        return self.scratch_dir or self.data_dir / "scratch"


def load_settings(cls: type[SettingsT], overrides: Mapping[str, object | None] = {}) -> SettingsT:
    """Settings from the environment, for a command: overrides (``MIRSERVE_*`` names) go into the environment
    first so that child processes see them too; invalid settings stop the program naming the variable."""
    for key, value in overrides.items():
        if value is not None:
            os.environ[key] = str(value)
    try:
        return cls()
    except ValidationError as error:
        problems = "; ".join(f"{'MIRSERVE_' + str(e['loc'][0]).upper() + ': ' if e['loc'] else ''}{e['msg']}"
                             for e in error.errors())
        raise SystemExit(f"mirserve: error: invalid settings: {problems}") from None
