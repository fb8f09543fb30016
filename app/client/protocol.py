"""What the synchronous and the asynchronous client share: configuration, the retry policy, request parts,
reading answers, the job's fields, and the state of a resumable, checked download. No I/O happens here.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import uuid
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Mapping

import httpx

from app.client.errors import IntegrityError, problem_error

DEFAULT_SERVER = "http://127.0.0.1:8000"
TERMINAL = frozenset({"succeeded", "failed", "canceled"})
#: Answers worth another try: the service (or a proxy before it) is overloaded or restarting.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
CHUNK_BYTES = 1 << 20


def server_url(server: str | None) -> str:
    """The given URL, else MIRSERVE_SERVER, else the local default."""
    url = (server or os.environ.get("MIRSERVE_SERVER") or DEFAULT_SERVER).strip()
    if not re.match(r"^https?://", url):
        url = f"http://{url}"
    return url.rstrip("/")


def auth_headers(token: str | None) -> dict[str, str]:
    """``Authorization: Bearer`` from the given token, else MIRSERVE_TOKEN; nothing without either."""
    token = token if token is not None else os.environ.get("MIRSERVE_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, honouring Retry-After, for connection errors and RETRY_STATUSES.

    Every request the client makes is safe to repeat: reads, DELETE, cancel, and job submission, which always
    carries an Idempotency-Key so that the service answers a repeated submission with the job it made.
    """

    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 20.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` counts from 1)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff)
        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    from datetime import datetime, timezone

    return max(0.0, (moment - datetime.now(timezone.utc)).total_seconds())


def raise_for_problem(response: httpx.Response) -> None:
    """Raise the typed error for an error answer; the problem document's fields go into the exception."""
    if response.status_code < 400:
        return
    problem: Any = None
    try:
        problem = response.json()
    except (ValueError, httpx.ResponseNotRead):
        pass
    if not isinstance(problem, dict):
        try:
            text = response.text.strip()[:300]
        except httpx.ResponseNotRead:  # a streamed answer the caller did not read
            text = ""
        problem = {"detail": text or f"HTTP {response.status_code} {response.reason_phrase}".strip()}
    request = response.request
    raise problem_error(response.status_code, problem, method=request.method, url=str(request.url),
                        retry_after=retry_after(response))


def submit_fields(places: str | None, options: Mapping[str, Any]) -> dict[str, str]:
    """The form fields before the model part: places and the options as JSON (refused before the upload)."""
    fields = {}
    if places is not None:
        fields["places"] = places if isinstance(places, str) else ",".join(places)
    if options:
        fields["options"] = json.dumps(dict(options))
    return fields


def new_idempotency_key() -> str:
    return f"mirserve-client-{uuid.uuid4()}"


class JobFields:
    """The job as the service last described it (``GET /jobs/{id}``); ``data`` is the whole document."""

    data: dict[str, Any]

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL

    @property
    def progress(self) -> dict[str, Any] | None:
        """``{"current_pass": ..., "index": i, "total": n}`` while running."""
        return self.data.get("progress")

    @property
    def summary(self) -> dict[str, Any] | None:
        return self.data.get("summary")

    @property
    def error(self) -> dict[str, Any] | None:
        """``{"type", "message", "field"}`` of a failed job."""
        return self.data.get("error")

    @property
    def artifact(self) -> dict[str, Any] | None:
        """``{"bytes", "sha256", "url", "data_url"}`` once the job has succeeded."""
        return self.data.get("artifact")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.status}>"


def content_disposition_name(response: httpx.Response, default: str) -> str:
    """The file name a Content-Disposition header gives (RFC 6266 ``filename*`` or ``filename``), made safe."""
    from urllib.parse import unquote

    header = response.headers.get("content-disposition", "")
    match = re.search(r"filename\*\s*=\s*[^']*''([^;]+)", header) or re.search(r'filename\s*=\s*"?([^";]+)"?', header)
    name = unquote(match.group(1)).strip() if match else default
    name = Path(name.replace("\\", "/")).name  # never a path: a name beside the model
    return name if name not in ("", ".", "..") else default


@dataclass
class Download:
    """One file being downloaded into ``<path>.part``: resumed where an earlier try stopped (Range + If-Range
    on the ETag), hashed as it arrives, and moved to ``path`` only when its sha256 is the announced one."""

    path: Path
    sha256: str | None
    size: int | None
    etag: str | None = None
    received: int = 0
    _hasher: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.part = self.path.with_name(self.path.name + ".part")
        self._hasher = hashlib.sha256()
        if self.part.is_file() and self.sha256:
            with open(self.part, "rb") as stream:  # what an interrupted run left: continue after it
                for block in iter(lambda: stream.read(CHUNK_BYTES), b""):
                    self._hasher.update(block)
                    self.received += len(block)
        else:
            self.part.unlink(missing_ok=True)
        if self.size is not None and self.received > self.size:
            self.restart()

    @property
    def complete(self) -> bool:
        return self.size is not None and self.received == self.size

    def headers(self) -> dict[str, str]:
        if self.received and self.etag:
            return {"Range": f"bytes={self.received}-", "If-Range": self.etag}
        return {}

    def restart(self) -> None:
        self.part.unlink(missing_ok=True)
        self._hasher, self.received = hashlib.sha256(), 0

    def begin(self, response: httpx.Response):
        """Check the answer and open the part file for it: 206 appends, 200 starts over."""
        etag = response.headers.get("etag")
        if self.etag and etag and etag != self.etag:
            raise IntegrityError(f"{self.path.name}: the server's ETag {etag} is not the job's {self.etag}; "
                                 f"the artifact changed")
        if response.status_code == 206:
            first = re.match(r"bytes (\d+)-", response.headers.get("content-range", ""))
            if not first or int(first.group(1)) != self.received:
                self.restart()
                raise IntegrityError(f"{self.path.name}: the server resumed at the wrong offset")
            return open(self.part, "ab")
        self.restart()
        return open(self.part, "wb")

    def write(self, stream, chunk: bytes) -> None:
        stream.write(chunk)
        self._hasher.update(chunk)
        self.received += len(chunk)

    def finish(self) -> Path:
        """Verify what arrived and move it into place; a mismatch removes the part file."""
        digest = self._hasher.hexdigest()
        if self.sha256 and digest != self.sha256:
            self.restart()
            raise IntegrityError(f"{self.path.name}: the download's sha256 {digest} is not the job's {self.sha256}")
        if self.size is not None and self.received != self.size:
            self.restart()
            raise IntegrityError(f"{self.path.name}: got {self.received} bytes, expected {self.size}")
        os.replace(self.part, self.path)
        return self.path
