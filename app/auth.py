"""Who is asking: every request but the health checks names an API key (``Authorization: Bearer``).

``MIRSERVE_AUTH=keys`` (the default): the key's owner and role make the request's ``Principal``; a user sees
only its own jobs (another owner's job is a 404, as if it did not exist), an admin sees all.
With an identity provider configured (``app.oidc``), its JWTs are accepted too, beside the keys.
``MIRSERVE_AUTH=none``: every request is the local user, who sees every job, as before keys existed; the
service then refuses to start on an address other than loopback unless ``MIRSERVE_ALLOW_INSECURE=1``.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.problems import ProblemError
from app.settings import Settings
from worker.jobs import Job, Role

KEY_PREFIX = "msk_"  # the service's own keys (worker.jobs.keys); any other bearer token may be an OIDC JWT
bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey", bearerFormat="msk_<id>_<secret>",
                    description="An API key made by `mirserve keys create` (sent as `Authorization: Bearer <key>`).")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


@dataclass(frozen=True)
class Principal:
    """The one a request acts for. ``owner`` None: the local user of a service without keys."""

    owner: str | None
    is_admin: bool

    @property
    def owner_filter(self) -> str | None:
        """The owner a listing is limited to; None: all jobs."""
        return None if self.is_admin else self.owner

    def may_see(self, job: Job) -> bool:
        return self.is_admin or job.owner == self.owner


LOCAL = Principal(owner=None, is_admin=True)


def unauthorized(detail: str, *, token_given: bool) -> ProblemError:
    """RFC 6750: 401 with a Bearer challenge (``invalid_token`` when a token came and was refused)."""
    challenge = 'Bearer realm="mirserve"' + (', error="invalid_token"' if token_given else "")
    return ProblemError(401, "unauthorized", detail, headers={"WWW-Authenticate": challenge})


def authenticate(request: Request, credentials: Credentials) -> Principal:
    """The request's principal, or a 401 problem. Reads one key row (sync: it runs in the thread pool)."""
    services = request.app.state.services
    if services.settings.auth == "none":
        return LOCAL
    if credentials is None:
        raise unauthorized("this API needs an API key: send it as 'Authorization: Bearer <key>' (an operator "
                           "makes keys with `mirserve keys create`)", token_given=False)
    token = credentials.credentials
    if services.oidc is not None and not token.startswith(KEY_PREFIX):  # a JWT of the identity provider
        checked = services.oidc.authenticate(token)
        if isinstance(checked, str):
            raise unauthorized(checked, token_given=True)
        return Principal(owner=checked[0], is_admin=checked[1])
    found = services.keys.authenticate(token)
    if isinstance(found, str):
        raise unauthorized(found, token_given=True)
    return Principal(owner=found.owner, is_admin=found.role is Role.ADMIN)


def authenticate_metrics(request: Request, credentials: Credentials) -> Principal | None:
    """``/metrics`` asks for a key only with ``MIRSERVE_METRICS_AUTH=1`` (scrapers send one as a bearer token)."""
    if not request.app.state.services.settings.metrics_auth:
        return None
    return authenticate(request, credentials)


PrincipalDep = Annotated[Principal, Depends(authenticate)]


class InsecureBind(RuntimeError):
    """The settings would expose every job to anyone who reaches the port."""


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings) -> None:
    """Refuse to serve without keys on an address others can reach, unless the operator says so."""
    if settings.auth == "none" and not is_loopback(settings.host) and not settings.allow_insecure:
        raise InsecureBind(
            f"MIRSERVE_AUTH=none on {settings.host}: anyone who reaches this address could read, download and "
            "delete every job. Use API keys (unset MIRSERVE_AUTH and make one with `mirserve keys create`), bind "
            "to 127.0.0.1, or set MIRSERVE_ALLOW_INSECURE=1 if something in front of the service authenticates")
