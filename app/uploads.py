"""Receiving ``POST /optimize``: the multipart body streamed to disk with a size cap and a sha256 on the way.

Starlette's form parser reads the whole body into spooled files before a handler runs, and neither uvicorn
nor FastAPI caps a request body. So the body is parsed here, chunk by chunk as it arrives: the ``model`` part
goes straight into a file under ``uploads/``, hashed as it is written, and the request is refused with 413 the
moment it passes the cap, with the partial file deleted. The model is never parsed by this process.
"""
from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, BinaryIO, Callable

from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.requests import ClientDisconnect

from app.problems import ProblemError

FILE_FIELD = "model"
TEXT_FIELDS = ("places", "options")
MAX_TEXT_FIELD_BYTES = 64 * 1024
#: Room for the multipart framing and the text fields when judging a declared Content-Length.
FORM_OVERHEAD_BYTES = len(TEXT_FIELDS) * MAX_TEXT_FIELD_BYTES + 64 * 1024
#: Raises (a ProblemError) when the text fields received so far are already invalid.
FieldCheck = Callable[[dict[str, str]], None]


@dataclass
class Upload:
    path: Path
    filename: str
    bytes: int
    sha256: str
    fields: dict[str, str]

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


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

    def __init__(self, target: BinaryIO, max_bytes: int, check_fields: FieldCheck | None = None):
        self.target = target
        self.max_bytes = max_bytes
        self.check_fields = check_fields
        self.digest = hashlib.sha256()
        self.size = 0
        self.filename: str | None = None
        self.fields: dict[str, str] = {}
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
                               f"{FILE_FIELD!r} (the model file), 'places' and 'options'", field=name or "form")
        if name in self.fields or (name == FILE_FIELD and self.filename is not None):
            raise ProblemError(422, "invalid-request", f"form field {name!r} is given twice", field=name)
        self.part.name = name
        if name == FILE_FIELD:
            raw = params.get(b"filename", b"model.onnx").decode("utf-8", "replace")
            self.filename = clean_filename(raw)
            if self.check_fields is not None:  # refuse bad places/options before receiving the model
                self.check_fields(dict(self.fields))

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


def upload_too_large(max_bytes: int) -> ProblemError:
    return ProblemError(413, "upload-too-large",
                        f"the model is larger than the upload limit of {_human(max_bytes)} (MIRSERVE_MAX_UPLOAD_MB)",
                        field=FILE_FIELD, max_bytes=max_bytes)


async def receive_upload(content_type: str | None, content_length: str | None, body: AsyncIterator[bytes],
                         uploads_dir: Path, max_bytes: int, check_fields: FieldCheck | None = None) -> Upload:
    """Stream a multipart body into ``uploads_dir``; on any error the partial file is removed.

    ``check_fields`` sees the text fields that came before the model part, when it starts: a client that sends
    places and options first has a bad value refused before the model is uploaded.
    """
    boundary = _boundary(content_type)
    if content_length and content_length.isdigit() and int(content_length) > max_bytes + FORM_OVERHEAD_BYTES:
        raise upload_too_large(max_bytes)
    uploads_dir.mkdir(parents=True, exist_ok=True)
    path = uploads_dir / f"{secrets.token_hex(16)}.part"
    try:
        with open(path, "wb") as target:
            receiver = _FormReceiver(target, max_bytes, check_fields)
            parser = MultipartParser(boundary, receiver.callbacks())
            try:
                async for chunk in body:
                    _feed(parser, chunk)
            except ClientDisconnect:
                raise ProblemError(400, "upload-interrupted", "the client went away before the upload was "
                                   "complete; nothing was kept") from None
            if parser.state not in (MultipartState.END, MultipartState.BOUNDARY_PADDING):
                raise ProblemError(400, "malformed-body", "the multipart body ended before its closing boundary")
        if receiver.filename is None:
            raise ProblemError(422, "invalid-request", f"the form has no {FILE_FIELD!r} file part", field=FILE_FIELD)
        if receiver.size == 0:
            raise ProblemError(422, "invalid-request", "the model file is empty", field=FILE_FIELD)
        return Upload(path, receiver.filename, receiver.size, receiver.digest.hexdigest(), receiver.fields)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _feed(parser: MultipartParser, chunk: bytes) -> None:
    try:
        parser.write(chunk)
    except ProblemError:
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
