"""The client's pure parts: backoff, Retry-After, problem documents to exceptions, file names, URLs."""
from __future__ import annotations

from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from app.client import errors
from app.client.protocol import RetryPolicy, content_disposition_name, raise_for_problem, retry_after, server_url


def answer(status: int, **kwargs) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "http://s/jobs/x"), **kwargs)


def test_backoff_grows_to_its_cap_and_retry_after_wins():
    policy = RetryPolicy(attempts=8, backoff=0.5, max_backoff=4)
    for attempt in range(1, 9):
        assert 0 <= policy.delay(attempt) <= min(4, 0.5 * 2 ** (attempt - 1))
    assert policy.delay(3, retry_after=1.5) == 1.5 and policy.delay(1, retry_after=999) == 4


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after(answer(503, headers={"Retry-After": "7"})) == 7.0
    soon = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after(answer(503, headers={"Retry-After": soon})) <= 30
    assert retry_after(answer(503, headers={"Retry-After": "whenever"})) is None
    assert retry_after(answer(503)) is None


@pytest.mark.parametrize("status, kind", [(400, errors.BadRequest), (401, errors.Unauthorized),
                                          (404, errors.NotFound), (409, errors.Conflict),
                                          (413, errors.PayloadTooLarge), (422, errors.InvalidRequest),
                                          (429, errors.RateLimited), (500, errors.ServerError),
                                          (503, errors.ServiceUnavailable), (418, errors.ProblemError)])
def test_each_status_is_its_own_exception_carrying_the_problem(status, kind):
    problem = {"type": "/problems/x-y", "title": "X y", "status": status, "detail": "what went wrong",
               "instance": "/jobs/x", "field": "places", "errors": [{"field": "places", "message": "bad"}],
               "job_id": "x"}
    with pytest.raises(kind) as raised:
        raise_for_problem(answer(status, json=problem, headers={"Retry-After": "3"}))
    error = raised.value
    assert (error.status, error.type, error.title, error.detail, error.instance, error.field) == (
        status, "/problems/x-y", "X y", "what went wrong", "/jobs/x", "places")
    assert error.errors == [{"field": "places", "message": "bad"}] and error.extensions == {"job_id": "x"}
    assert str(error) == "what went wrong (field places)" and error.slug == "x-y"
    assert error.method == "GET" and error.url == "http://s/jobs/x"
    if kind is errors.RateLimited:
        assert error.retry_after == 3.0


def test_an_error_that_is_no_problem_document_still_says_something():
    with pytest.raises(errors.ServerError, match="^upstream timed out$"):
        raise_for_problem(answer(502, text="upstream timed out"))
    with pytest.raises(errors.NotFound, match=r"^HTTP 404 Not Found$"):
        raise_for_problem(answer(404))
    raise_for_problem(answer(204))  # no error


@pytest.mark.parametrize("header, name", [
    ('attachment; filename="model.onnx.data"', "model.onnx.data"),
    ("attachment; filename*=utf-8''mod%C3%A8le.onnx.data", "modèle.onnx.data"),
    ('attachment; filename="../../etc/passwd"', "passwd"),
    ('attachment; filename=".."', "fallback"),
    ("", "fallback"),
])
def test_a_download_name_is_a_plain_name(header, name):
    assert content_disposition_name(answer(200, headers={"content-disposition": header}), "fallback") == name


def test_server_urls(monkeypatch):
    monkeypatch.delenv("MIRSERVE_SERVER", raising=False)
    assert server_url(None) == "http://127.0.0.1:8000"
    assert server_url("example.org:9000/") == "http://example.org:9000"
    monkeypatch.setenv("MIRSERVE_SERVER", "https://mirserve.example/")
    assert server_url(None) == "https://mirserve.example" and server_url("http://a") == "http://a"
