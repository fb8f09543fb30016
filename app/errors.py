"""What can go wrong with a request, in the service's own terms; ``app.problems`` answers each over HTTP.

Services raise these; they know nothing of status codes. ``code`` names the kind of problem (it becomes the
problem type ``/problems/<code>``), ``detail`` is a sentence for the user, ``field`` the request field at
fault, and any other keyword is kept as an extension member of the problem document.
"""
from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    def __init__(self, code: str, detail: str, *, field: str | None = None, **extensions: Any):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.field = field
        self.extensions = extensions


class NotFound(ServiceError):
    """The job, or the thing asked of it, does not exist."""


class Conflict(ServiceError):
    """The job is not in a state that allows this."""


class InvalidRequest(ServiceError):
    """A request field is invalid."""


class Unavailable(ServiceError):
    """A dependency is down or the service is full; the client may try again after ``retry_after`` seconds."""

    def __init__(self, code: str, detail: str, *, retry_after: int, **extensions: Any):
        super().__init__(code, detail, **extensions)
        self.retry_after = retry_after
