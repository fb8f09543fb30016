"""The API's settings: the job side's (``worker.jobs.JobSettings``) plus what only the HTTP side uses."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

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
    # Tokens of an identity provider (app.oidc), accepted beside the API keys when the issuer is set.
    oidc_issuer: str | None = Field(None, description="the 'iss' every accepted JWT must carry")
    oidc_jwks_url: str | None = Field(None, description="where the issuer publishes its signing keys (JWKS)")
    oidc_audience: str | None = Field(None, description="the 'aud' every accepted JWT must carry")
    oidc_owner_claim: str = Field("sub", description="the claim that names a token's owner")
    oidc_roles_claim: str = Field("roles", description="the claim listing a token's roles")
    oidc_admin_role: str = Field(default="mirserve-admin", description="the role that makes a token an admin")
    # Per owner of a user key (admins have no limits); 0: no limit. See app.quotas.
    quota_active_jobs: int = Field(10, ge=0, description="queued and running jobs per owner")
    quota_stored_mb: float = Field(10240.0, ge=0, description="uploads and artifacts kept per owner")
    quota_uploads_per_minute: int = Field(30, ge=0, description="submissions per owner and minute, per API process")

    @model_validator(mode="after")
    def _oidc_complete(self):
        if self.oidc_issuer and not (self.oidc_jwks_url and self.oidc_audience):
            raise ValueError("MIRSERVE_OIDC_ISSUER needs MIRSERVE_OIDC_JWKS_URL and MIRSERVE_OIDC_AUDIENCE too: "
                             "a token is accepted only when signed by the issuer's keys and meant for this service")
        return self

    @property
    def quota_stored_bytes(self) -> int:
        return int(self.quota_stored_mb * (1 << 20))

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * (1 << 20))
