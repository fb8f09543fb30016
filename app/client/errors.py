"""What the client raises: the service's RFC 9457 problems as typed exceptions, and the client's own failures.

Every ``ProblemError`` carries the problem document's fields (``type``, ``title``, ``status``, ``detail``,
``instance``, ``field``, ``errors``) and its extension members (``job_id``, ``job_status``, ...) in
``extensions``; ``str(error)`` is the detail, with the field at fault.
"""
from __future__ import annotations

from typing import Any, Mapping


class MirserveClientError(Exception):
    """Base class of everything the client raises on purpose."""


class ProblemError(MirserveClientError):
    """The service answered with an error (an ``application/problem+json`` document, or a bare status)."""

    def __init__(self, status: int, problem: Mapping[str, Any] | None = None, *, method: str = "", url: str = ""):
        problem = dict(problem or {})
        self.status = status
        self.type: str = str(problem.pop("type", "about:blank"))
        self.title: str = str(problem.pop("title", "") or "")
        problem.pop("status", None)
        self.detail: str | None = problem.pop("detail", None)
        self.instance: str | None = problem.pop("instance", None)
        self.field: str | None = problem.pop("field", None)
        self.errors: list[dict[str, Any]] = list(problem.pop("errors", None) or [])
        self.extensions: dict[str, Any] = problem
        self.method, self.url = method, url
        super().__init__(self._message())

    def _message(self) -> str:
        text = self.detail or self.title or f"HTTP {self.status}"
        where = f" (field {self.field})" if self.field and self.field not in text else ""
        return f"{text}{where}"

    @property
    def slug(self) -> str:
        """The last part of the problem type: ``/problems/invalid-option`` -> ``invalid-option``."""
        return self.type.rstrip("/").rsplit("/", 1)[-1]


class BadRequest(ProblemError):
    """400: the request body is malformed."""


class Unauthorized(ProblemError):
    """401: no credentials, or credentials the service does not accept (set ``token`` or MIRSERVE_TOKEN)."""


class Forbidden(ProblemError):
    """403: the credentials do not allow this."""


class NotFound(ProblemError):
    """404: no such job (or no such data for it)."""


class Conflict(ProblemError):
    """409: the job is not in a state that allows this (no artifact yet, already finished, running)."""


class PayloadTooLarge(ProblemError):
    """413: the model is larger than the service accepts."""


class UnsupportedMediaType(ProblemError):
    """415: the body is not what the endpoint takes."""


class InvalidRequest(ProblemError):
    """422: a request field is invalid; ``field`` names it and ``errors`` lists every invalid one."""


class RateLimited(ProblemError):
    """429: a quota or rate limit; ``retry_after`` says when to try again (seconds), when the service said."""

    retry_after: float | None = None


class ServerError(ProblemError):
    """5xx: the service failed; the cause is in its log."""


class ServiceUnavailable(ServerError):
    """503: a dependency of the service (database, queue, storage, workers) is unavailable."""


_BY_STATUS: dict[int, type[ProblemError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                             409: Conflict, 413: PayloadTooLarge, 415: UnsupportedMediaType,
                                             422: InvalidRequest, 429: RateLimited, 503: ServiceUnavailable}


def problem_error(status: int, problem: Mapping[str, Any] | None, *, method: str = "", url: str = "",
                  retry_after: float | None = None) -> ProblemError:
    """The exception for an error answer: by status, or ServerError / ProblemError for the others."""
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else ProblemError)
    error = kind(status, problem, method=method, url=url)
    if isinstance(error, RateLimited):
        error.retry_after = retry_after
    return error


class ConnectionFailed(MirserveClientError):
    """The service could not be reached (or the connection broke) on every try."""


class IntegrityError(MirserveClientError):
    """A download does not have the sha256 (or the ETag) the job announced; the partial file is removed."""


class JobFailed(MirserveClientError):
    """The job ended ``failed``; ``job.error`` says what and where (``type``, ``message``, ``field``)."""

    def __init__(self, job: Any):
        self.job = job
        error = job.error or {}
        field = f" (field {error['field']})" if error.get("field") else ""
        super().__init__(f"job {job.id} failed: {error.get('type', 'Error')}: {error.get('message', '')}{field}")


class JobCanceled(MirserveClientError):
    """The job ended ``canceled``."""

    def __init__(self, job: Any):
        self.job = job
        super().__init__(f"job {job.id} was canceled")


class WaitTimeout(MirserveClientError):
    """``wait(timeout=...)`` ran out before the job ended; the job goes on."""

    def __init__(self, job: Any, timeout: float):
        self.job = job
        super().__init__(f"job {job.id} is still {job.status} after {timeout:g} s")
