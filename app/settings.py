"""The API's settings: the job side's (``worker.jobs.JobSettings``) plus what only the HTTP side uses."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from worker.jobs import JobSettings


class Settings(JobSettings):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_upload_mb: float = Field(512.0, gt=0, description="uploads above this get 413")
    max_queued: int = Field(0, ge=0, description="submissions get 503 with Retry-After while this many jobs wait "
                            "for a worker; 0: no limit")
    auth: Literal["keys", "none"] = Field("keys", description="keys: every request but /healthz and /readyz needs "
                                          "an API key (mirserve keys create); none: no authentication, for a "
                                          "service on 127.0.0.1 only")
    allow_insecure: bool = Field(False, description="allow MIRSERVE_AUTH=none on an address other than loopback")
    metrics_auth: bool = Field(False, description="/metrics needs an API key too")

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * (1 << 20))
