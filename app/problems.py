"""RFC 9457 problem details: every error the service answers, routing and validation errors included.

A problem's ``type`` is a relative URI ``/problems/<slug>`` naming the kind of problem (``about:blank`` for
plain HTTP errors such as an unknown path), ``detail`` is a sentence for the user, and ``field`` names the
request field at fault when there is one. The services' errors (``app.errors``) get their status here;
``ProblemError`` is for the HTTP layer itself (the multipart body, its size, its media type).
"""
from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from app.errors import Conflict, InvalidRequest, NotFound, ServiceError, Unavailable
from app.quotas import QuotaExceeded

PROBLEM_MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("mirserve.api")


class FieldProblem(BaseModel):
    field: str = Field(description="where the bad value is, e.g. 'places', 'options.opt_level', 'query.limit'")
    message: str


class Problem(BaseModel):
    """An RFC 9457 problem details object."""

    model_config = ConfigDict(extra="allow")

    type: str = Field("about:blank", description="URI reference naming the kind of problem")
    title: str = Field(description="short summary of the kind of problem")
    status: int = Field(description="the HTTP status code")
    detail: str | None = Field(None, description="what went wrong in this occurrence, for a person")
    instance: str | None = Field(None, description="the request path")
    field: str | None = Field(None, description="the request field at fault, when there is one")
    errors: list[FieldProblem] | None = Field(None, description="every invalid field, for validation errors")


class ProblemError(Exception):
    """Raise to answer with a problem; ``slug`` becomes the type ``/problems/<slug>``."""

    def __init__(self, status: int, slug: str, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, **extensions: Any):
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        self.extensions = extensions


def problem_response(request: Request | None, status: int, *, detail: str | None = None, slug: str | None = None,
                     field: str | None = None, headers: dict[str, str] | None = None,
                     **extensions: Any) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"/problems/{slug}" if slug else "about:blank",
        "title": _title(status, slug),
        "status": status,
    }
    if detail:
        body["detail"] = detail
    if request is not None:
        body["instance"] = request.url.path
    if field:
        body["field"] = field
    body.update({k: v for k, v in extensions.items() if v is not None})
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def _title(status: int, slug: str | None) -> str:
    if slug:
        return slug.replace("-", " ").capitalize()
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


async def _on_problem(request: Request, error: ProblemError) -> JSONResponse:
    return problem_response(request, error.status, detail=error.detail, slug=error.slug, field=error.field,
                            headers=error.headers, **error.extensions)


#: The status of each kind of service error (the most specific class listed wins).
SERVICE_ERROR_STATUS: dict[type[ServiceError], int] = {NotFound: 404, Conflict: 409, InvalidRequest: 422,
                                                       Unavailable: 503, QuotaExceeded: 429}


def service_error_status(error: ServiceError) -> int:
    return next((status for kind, status in SERVICE_ERROR_STATUS.items() if isinstance(error, kind)), 500)


async def _on_service_error(request: Request, error: ServiceError) -> JSONResponse:
    retry_after = getattr(error, "retry_after", None)  # Unavailable, QuotaExceeded
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return problem_response(request, service_error_status(error), detail=error.detail, slug=error.code,
                            field=error.field, headers=headers, **error.extensions)


async def _on_http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    detail = error.detail if isinstance(error.detail, str) else None
    if error.status_code == 404 and detail == "Not Found":
        detail = f"there is nothing at {request.url.path}"
    headers = dict(getattr(error, "headers", None) or {})
    if error.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
        given = {m.strip() for m in headers.get("Allow", "").split(",") if m.strip()}
        headers["Allow"] = ", ".join(sorted(given | _documented_methods(request)))
    return problem_response(request, error.status_code, detail=detail, headers=headers or None)


def _documented_methods(request: Request) -> set[str]:
    """The methods the OpenAPI document lists for this path (Starlette names only one route's methods)."""
    table = getattr(request.app.state, "methods_by_path", None)
    if table is None:
        paths = request.app.openapi()["paths"]
        table = [(compile_path(path)[0], {m.upper() for m in item}) for path, item in paths.items()]
        request.app.state.methods_by_path = table
    return {m for regex, methods in table if regex.match(request.url.path) for m in methods}


async def _on_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    problems = [{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "request",
                 "message": e.get("msg", "invalid value")} for e in error.errors()]
    first = problems[0] if problems else {"field": "request", "message": "invalid request"}
    return problem_response(request, 422, slug="invalid-request", field=first["field"],
                            detail=f"{first['field']}: {first['message']}", errors=problems)


async def _on_unexpected(request: Request, error: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response(request, 500, slug="internal-error",
                            detail="the server failed to handle this request; the error is in its log")


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)


_DESCRIPTIONS = {
    304: "Not modified: the artifact still has the ETag given in If-None-Match.",
    400: "Malformed request body.",
    401: "No API key, or one that is not valid, expired or revoked (send `Authorization: Bearer <key>`).",
    404: "No such job (or no such data for it).",
    409: "The job is not in a state that allows this (e.g. no artifact before it succeeded).",
    413: "The upload (or a form field) is larger than the configured limit; nothing was kept.",
    415: "The request body is not multipart/form-data.",
    416: "The Range asked for lies beyond the end; Content-Range gives the size.",
    422: "A request field is invalid; `field` names it.",
    429: "A quota or rate limit of your account is reached; `limit` names it, Retry-After says when to try again.",
    500: "An error of the server.",
    503: "A dependency (database, storage, queue or workers) is unavailable.",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error statuses, all problem+json (500 always included)."""
    entries: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(statuses) | {500}):
        entries[status] = {
            "description": _DESCRIPTIONS[status],
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    return entries
