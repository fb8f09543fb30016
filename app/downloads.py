"""Downloads that can resume: byte ranges (RFC 9110 ``Range`` / ``If-Range``) of a stored file or of a tar
archive made of stored files on the fly.

A model with external data is two files; ``TarOfFiles`` hands them out as one uncompressed tar without
building it: the archive's layout (a 512-byte header per member, the member's bytes padded to 512, two zero
blocks at the end) follows from the members' sizes, so its length is known before the first byte is sent and
any byte range of it is produced by reading only the parts of the members that range covers.
"""
from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator
from urllib.parse import quote

if TYPE_CHECKING:
    from starlette.responses import Response

BLOCK = 512
#: ``opener(offset)`` streams a member's bytes from ``offset`` to its end.
Opener = Callable[[int], Iterator[bytes]]
#: ``read(start, end)`` streams the bytes [start, end) of a download.
Reader = Callable[[int, int], Iterator[bytes]]


@dataclass(frozen=True)
class TarMember:
    name: str
    size: int
    opener: Opener


@dataclass(frozen=True)
class _Segment:
    start: int
    size: int
    data: bytes | None = None        # a header or padding
    opener: Opener | None = None     # a member's bytes


class TarOfFiles:
    """An uncompressed tar of ``members``, readable at any byte range (GNU format: members over 8 GiB too)."""

    def __init__(self, members: list[TarMember], mtime: int = 0):
        self.segments: list[_Segment] = []
        position = 0
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.size, info.mtime, info.mode = member.size, mtime, 0o644
            header = info.tobuf(tarfile.GNU_FORMAT)
            position = self._add(position, _Segment(position, len(header), data=header))
            position = self._add(position, _Segment(position, member.size, opener=member.opener))
            padding = -member.size % BLOCK
            position = self._add(position, _Segment(position, padding, data=bytes(padding)))
        self.size = self._add(position, _Segment(position, 2 * BLOCK, data=bytes(2 * BLOCK)))

    def _add(self, position: int, segment: _Segment) -> int:
        if segment.size:
            self.segments.append(segment)
        return position + segment.size

    def read(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes ``[start, end)`` of the archive, in chunks."""
        end = self.size if end is None else end
        for segment in self.segments:
            low, high = max(start, segment.start), min(end, segment.start + segment.size)
            if low >= high:
                continue
            if segment.data is not None:
                yield segment.data[low - segment.start:high - segment.start]
                continue
            left = high - low
            for chunk in segment.opener(low - segment.start):
                if len(chunk) >= left:
                    yield chunk[:left]
                    break
                yield chunk
                left -= len(chunk)


_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def requested_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """``[start, end)`` of a single-range ``Range`` header; None to send everything (no header, several
    ranges, or a form this does not take, which RFC 9110 lets a server ignore); "unsatisfiable" when the
    range lies beyond the end."""
    if header is None:
        return None
    found = _RANGE.fullmatch(header.strip())
    if found is None or (not found[1] and not found[2]):
        return None
    if not found[1]:  # the last N bytes
        suffix = int(found[2])
        return (max(0, size - suffix), size) if suffix else "unsatisfiable"
    start = int(found[1])
    end = min(size, int(found[2]) + 1) if found[2] else size
    if found[2] and int(found[2]) < start:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, end


def ranged(size: int, read: Reader, etag: str, filename: str, media_type: str,
           range_header: str | None, if_range: str | None) -> Response:
    """Answer a download of ``size`` bytes: all of it (200), the one range asked for (206), or 416."""
    from starlette.responses import StreamingResponse

    from app.problems import ProblemError

    headers = {"ETag": etag, "Accept-Ranges": "bytes", "Content-Disposition": attachment(filename)}
    wanted = requested_range(range_header, size) if if_range is None or if_range.strip() == etag else None
    if wanted == "unsatisfiable":
        raise ProblemError(416, "range-not-satisfiable", f"the range {range_header!r} starts beyond the end of the "
                           f"{size} bytes of {filename!r}", headers={"Content-Range": f"bytes */{size}"})
    start, end = wanted if isinstance(wanted, tuple) else (0, size)
    headers["Content-Length"] = str(end - start)
    if isinstance(wanted, tuple):
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return StreamingResponse(read(start, end), status_code=206 if isinstance(wanted, tuple) else 200,
                             media_type=media_type, headers=headers)


def attachment(filename: str) -> str:
    """The Content-Disposition FileResponse would send for this name (RFC 6266, RFC 5987 beyond ASCII)."""
    quoted = quote(filename)
    return f"attachment; filename*=utf-8''{quoted}" if quoted != filename else f'attachment; filename="{filename}"'
