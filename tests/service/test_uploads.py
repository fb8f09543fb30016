"""Streaming the multipart upload into the store (the data directory, or S3 multipart on moto's server): the
cap is enforced while reading, and nothing is left behind."""
from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from app.problems import ProblemError
from app.uploads import clean_filename, receive_upload
from worker.jobs.storage import LocalStorage, open_storage

BOUNDARY = "mirserve-test-boundary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def multipart(*parts: tuple[str, bytes, str | None], close: bool = True) -> bytes:
    body = b""
    for name, data, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return body + (f"--{BOUNDARY}--\r\n".encode() if close else b"")


class Body:
    """An async body that counts how much of itself was read."""

    def __init__(self, data: bytes, chunk: int = 64 * 1024):
        self.chunks = [data[i:i + chunk] for i in range(0, len(data), chunk)]
        self.read = 0

    async def __aiter__(self):
        for chunk in self.chunks:
            self.read += 1
            yield chunk


KEY = "jobs/j/input.onnx"


@pytest.fixture
def store(tmp_path):
    return LocalStorage(tmp_path / "data")


@pytest.fixture(params=["local", "s3"])
def any_store(request, tmp_path):
    if request.param == "local":
        return LocalStorage(tmp_path / "data")
    return open_storage(f"s3://{request.getfixturevalue('s3_bucket')}/uploads", tmp_path / "data")


def receive(body: bytes | Body, store, max_bytes=1 << 20, content_type=CONTENT_TYPE, declare_length=False,
            check=None):
    stream = body if isinstance(body, Body) else Body(body, chunk=7)  # tiny chunks split every boundary
    length = str(sum(len(c) for c in stream.chunks)) if declare_length else None
    return asyncio.run(receive_upload(content_type, length, stream.__aiter__(), store.writer(KEY), max_bytes, check))


def nothing_kept(store) -> bool:
    """No object, no part of one, no directory made for one."""
    return store.children("jobs/") == [] and store.sweep_partial(0) == 0


def refused(store, body, **kwargs) -> ProblemError:
    with pytest.raises(ProblemError) as raised:
        receive(body, store, **kwargs)
    assert nothing_kept(store), "a refused upload left something behind"
    return raised.value


def test_model_is_written_with_its_sha256_and_the_fields_are_kept(any_store):
    model = os.urandom(9 << 20)  # more than one S3 part
    upload = receive(Body(multipart(("places", b"arm/fp16/nhwc", None), ("model", model, "det.onnx"),
                                    ("options", b'{"opt_level": 1}', None))), any_store, max_bytes=16 << 20)
    assert any_store.read_bytes(KEY, 16 << 20) == model and upload.bytes == len(model)
    assert upload.sha256 == hashlib.sha256(model).hexdigest()
    assert upload.fields == {"places": "arm/fp16/nhwc", "options": '{"opt_level": 1}'}
    assert upload.filename == "det.onnx"


def test_an_upload_over_the_cap_is_refused_while_streaming_and_leaves_nothing(any_store):
    body = Body(multipart(("model", b"\0" * (24 << 20), "big.onnx")))
    error = refused(any_store, body, max_bytes=10 << 20)  # after a first S3 part was sent
    assert error.status == 413 and error.field == "model" and "10 MiB" in error.detail
    assert body.read <= 180, f"read {body.read} of {len(body.chunks)} chunks before refusing"


def test_a_declared_length_over_the_cap_is_refused_before_reading(store):
    body = Body(multipart(("model", b"\0" * (4 << 20), "big.onnx")))
    assert refused(store, body, max_bytes=1 << 20, declare_length=True).status == 413
    assert body.read == 0


def test_a_body_that_is_not_multipart_is_415(store):
    error = refused(store, b"{}", content_type="application/json")
    assert error.status == 415 and "multipart/form-data" in error.detail


@pytest.mark.parametrize("body, content_type, status, field", [
    (multipart(("model", b"abc", "m.onnx")), "multipart/form-data", 400, None),  # no boundary
    (multipart(("model", b"abc", "m.onnx"), close=False), CONTENT_TYPE, 400, None),  # cut short
    (multipart(("places", b"x86", None)), CONTENT_TYPE, 422, "model"),
    (multipart(("model", b"", "m.onnx")), CONTENT_TYPE, 422, "model"),
    (multipart(("model", b"a", "m.onnx"), ("model", b"b", "n.onnx")), CONTENT_TYPE, 422, "model"),
    (multipart(("model", b"a", "m.onnx"), ("color", b"red", None)), CONTENT_TYPE, 422, "color"),
    (multipart(("options", b"x" * (65 * 1024), None), ("model", b"a", "m.onnx")), CONTENT_TYPE, 413, "options"),
    (multipart(("places", b"\xff\xfe", None), ("model", b"a", "m.onnx")), CONTENT_TYPE, 422, "places"),
], ids=["no-boundary", "truncated", "no-model", "empty-model", "two-models", "unknown-field", "huge-field",
        "not-utf8"])
def test_malformed_forms_are_refused_naming_the_problem(store, body, content_type, status, field):
    error = refused(store, body, content_type=content_type)
    assert (error.status, error.field) == (status, field), error.detail


@pytest.mark.parametrize("given, expected", [
    ("../../etc/passwd", "passwd"), ("C:\\models\\det.onnx", "det.onnx"), ('a"b\r\n.onnx', "a_b_.onnx"),
    ("", "model.onnx"), ("..", "model.onnx"),
])
def test_client_file_names_are_reduced_to_safe_base_names(given, expected):
    assert clean_filename(given) == expected


def test_a_client_that_goes_away_mid_upload_leaves_nothing(any_store):
    from starlette.requests import ClientDisconnect

    async def body():
        yield multipart(("model", b"\0" * (10 << 20), "m.onnx"))[:9 << 20]  # an S3 part went out
        raise ClientDisconnect()

    with pytest.raises(ProblemError) as raised:
        asyncio.run(receive_upload(CONTENT_TYPE, None, body(), any_store.writer(KEY), 16 << 20))
    assert raised.value.status == 400 and raised.value.slug == "upload-interrupted"
    assert nothing_kept(any_store)


def test_bad_fields_sent_before_the_model_are_refused_before_the_model_is_read(store):
    def check(fields):
        if fields.get("places") == "tpu":
            raise ProblemError(422, "invalid-option", "bad target 'tpu'", field="places")
        return ("checked", fields.get("places"))

    body = Body(multipart(("places", b"tpu", None), ("model", b"\0" * (4 << 20), "m.onnx")))
    with pytest.raises(ProblemError) as raised:
        receive(body, store, max_bytes=8 << 20, check=check)
    assert raised.value.field == "places" and body.read == 1 and nothing_kept(store)
    good = receive(Body(multipart(("places", b"x86", None), ("model", b"\1" * 1000, "m.onnx"))), store, check=check)
    assert good.bytes == 1000 and good.checked == ("checked", "x86")  # the route reuses what the check made
    late = receive(Body(multipart(("places", b"x86", None), ("model", b"\1" * 1000, "m.onnx"),
                                  ("options", b"{}", None))), store, check=check)
    assert late.checked is None  # a field came after the check: the route checks again
