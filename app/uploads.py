"""Receiving ``POST /optimize``: the multipart body streamed to the store with a size cap and a sha256 on the way.

Starlette's form parser reads the whole body into spooled files before a handler runs, and neither uvicorn
nor FastAPI caps a request body. So the body is parsed here, chunk by chunk as it arrives: the ``model`` part
goes straight into the store's writer for the job's input (a file renamed into place when complete, or an S3
multipart upload whose parts are sent off the event loop), hashed as it is written, and the request is refused
with 413 the moment it passes the cap, with what was written thrown away. The model is never parsed by this
process.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import anyio
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.requests import ClientDisconnect

from app.errors import ServiceError
from app.problems import ProblemError
from worker.jobs import ObjectWriter

FILE_FIELD = "model"
TEXT_FIELDS = ("places", "options", "callback_url")
MAX_TEXT_FIELD_BYTES = 64 * 1024
#: Room for the multipart framing and the text fields when judging a declared Content-Length.
FORM_OVERHEAD_BYTES = len(TEXT_FIELDS) * MAX_TEXT_FIELD_BYTES + 64 * 1024
#: Checks the text fields received so far: returns what it made of them, or raises when they are invalid.
FieldCheck = Callable[[dict[str, str]], Any]


@dataclass
class Upload:
    """A received model, committed to the store, and the form's text fields."""

    filename: str
    bytes: int
    sha256: str
    fields: dict[str, str]
    #: What the field check returned, when it saw every text field (none came after the model); else None.
    checked: Any = None


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    header_field: bytes = b""
    header_value: bytes = b""
    headers: dict[bytes, bytes] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)


class _FormReceiver:
    """The parser callbacks: text fields kept in memory (bounded), the model part written to ``target``."""

    def __init__(self, target: ObjectWriter, max_bytes: int, check_fields: FieldCheck | None = None):
        self.target = target
        self.max_bytes = max_bytes
        self.check_fields = check_fields
        self.digest = hashlib.sha256()
        self.size = 0
        self.filename: str | None = None
        self.fields: dict[str, str] = {}
        self.checked: Any = None
        self.part = _Part()

    def callbacks(self) -> dict:
        return {"on_part_begin": self._begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_done, "on_part_data": self._data, "on_part_end": self._end}

    def _begin(self) -> None:
        self.part = _Part()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self.part.header_field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self.part.header_value += data[start:end]

    def _header_end(self) -> None:
        self.part.headers[self.part.header_field.strip().lower()] = self.part.header_value.strip()
        self.part.header_field, self.part.header_value = b"", b""

    def _headers_done(self) -> None:
        _, params = parse_options_header(self.part.headers.get(b"content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        if name != FILE_FIELD and name not in TEXT_FIELDS:
            raise ProblemError(422, "invalid-request", f"unknown form field {name!r}; the form takes "
                               f"{FILE_FIELD!r} (the model file), 'places', 'options' and 'callback_url'",
                               field=name or "form")
        if name in self.fields or (name == FILE_FIELD and self.filename is not None):
            raise ProblemError(422, "invalid-request", f"form field {name!r} is given twice", field=name)
        self.part.name = name
        if name == FILE_FIELD:
            raw = params.get(b"filename", b"model.onnx").decode("utf-8", "replace")
            self.filename = clean_filename(raw)
            if self.check_fields is not None:  # refuse bad places/options before receiving the model
                self.checked = self.check_fields(dict(self.fields))

    def _data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.part.name == FILE_FIELD:
            self.size += len(chunk)
            if self.size > self.max_bytes:
                raise upload_too_large(self.max_bytes)
            self.digest.update(chunk)
            self.target.write(chunk)
            return
        self.part.data += chunk
        if len(self.part.data) > MAX_TEXT_FIELD_BYTES:
            raise ProblemError(413, "field-too-large", f"form field {self.part.name!r} is larger than "
                               f"{MAX_TEXT_FIELD_BYTES // 1024} KiB", field=self.part.name)

    def _end(self) -> None:
        if self.part.name in TEXT_FIELDS:
            try:
                self.fields[self.part.name] = self.part.data.decode("utf-8")
            except UnicodeDecodeError:
                raise ProblemError(422, "invalid-request", f"form field {self.part.name!r} is not UTF-8 text",
                                   field=self.part.name) from None
            self.checked = None  # a field after the model: the check saw too little


def upload_too_large(max_bytes: int) -> ProblemError:
    return ProblemError(413, "upload-too-large",
                        f"the model is larger than the upload limit of {_human(max_bytes)} (MIRSERVE_MAX_UPLOAD_MB)",
                        field=FILE_FIELD, max_bytes=max_bytes)


async def receive_upload(content_type: str | None, content_length: str | None, body: AsyncIterator[bytes],
                         writer: ObjectWriter, max_bytes: int, check_fields: FieldCheck | None = None) -> Upload:
    """Stream a multipart body's model into ``writer`` and commit it; on any error it is aborted instead.

    ``check_fields`` sees the text fields that came before the model part, when it starts: a client that sends
    places and options first has a bad value refused before the model is uploaded, and what the check made of
    them is the upload's ``checked`` (None when a field came after the model, so the caller checks again).
    """
    try:
        boundary = _boundary(content_type)
        if content_length and content_length.isdigit() and int(content_length) > max_bytes + FORM_OVERHEAD_BYTES:
            raise upload_too_large(max_bytes)
        receiver = _FormReceiver(writer, max_bytes, check_fields)
        parser = MultipartParser(boundary, receiver.callbacks())
        try:
            async for chunk in body:
                _feed(parser, chunk)
                if writer.due:  # a full part to send (S3): blocking I/O, so in a thread
                    await anyio.to_thread.run_sync(writer.flush)
        except ClientDisconnect:
            raise ProblemError(400, "upload-interrupted", "the client went away before the upload was "
                               "complete; nothing was kept") from None
        if parser.state not in (MultipartState.END, MultipartState.BOUNDARY_PADDING):
            raise ProblemError(400, "malformed-body", "the multipart body ended before its closing boundary")
        if receiver.filename is None:
            raise ProblemError(422, "invalid-request", f"the form has no {FILE_FIELD!r} file part", field=FILE_FIELD)
        if receiver.size == 0:
            raise ProblemError(422, "invalid-request", "the model file is empty", field=FILE_FIELD)
        await anyio.to_thread.run_sync(writer.commit)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(writer.abort)
        raise
    return Upload(receiver.filename, receiver.size, receiver.digest.hexdigest(), receiver.fields, receiver.checked)


def _feed(parser: MultipartParser, chunk: bytes) -> None:
    try:
        parser.write(chunk)
    except (ProblemError, ServiceError):  # raised by our callbacks: the body is well formed, its content is not
        raise
    except Exception as error:  # the parser's own errors: a malformed body
        raise ProblemError(400, "malformed-body", f"the multipart body is malformed: {error}") from None


def _boundary(content_type: str | None) -> bytes:
    media_type, params = parse_options_header(content_type or "")
    if media_type != b"multipart/form-data":
        raise ProblemError(415, "unsupported-media-type",
                           "send the model as multipart/form-data with a 'model' file part "
                           f"(got {media_type.decode('latin-1') or 'no content type'})")
    boundary = params.get(b"boundary")
    if not boundary:
        raise ProblemError(400, "malformed-body", "the multipart/form-data content type has no boundary")
    return boundary


_UNSAFE = re.compile(r"[^\w.\- ]+")


def clean_filename(name: str) -> str:
    """The base name of a client-given file name, safe to echo in a Content-Disposition header."""
    base = os.path.basename(name.replace("\\", "/")).strip()
    base = _UNSAFE.sub("_", base)[:200].strip(". ")
    return base or "model.onnx"


def _human(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"
