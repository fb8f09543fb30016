"""Archive uploads: a ``.zip`` or ``.tar`` (optionally gzip) holding one ``.onnx`` model and its external data.

An archive comes from an untrusted client, so nothing in it is taken on trust. ``list_members`` reads what
the archive declares (zip's central directory, tar's headers) and refuses, naming the member:

- a name that is absolute, has a ``..`` component, a backslash, a control character, or appears twice;
- anything but a regular file or a directory: symbolic and hard links, devices, FIFOs;
- an encrypted zip member;
- more members than ``ArchiveLimits.max_members``, a member or a total above ``max_unpacked_bytes``, and a
  zip member (or a gzip tar as a whole) that would expand more than ``max_ratio`` times (a zip bomb);
- no ``.onnx`` member, or more than one.

``extract`` checks the same list again and then writes each member under the extraction directory, which it
creates and which must not exist yet: directories are made one component at a time and files are created
with ``O_EXCL | O_NOFOLLOW``, so nothing can be written through a link; the bytes written are counted against
the declared size, so a member whose data runs longer than its header is refused too. The model's external
data locations are then the engine's business: it reads them only inside the extraction directory.

The API lists the members of a stored upload (a 422 before the job exists); the engine process, fenced in
its attempt directory, extracts them (``worker.jobs.child``).
"""
from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

from worker.engine.errors import ModelError

CHUNK = 1 << 20
#: Below this many unpacked bytes the expansion ratio is not judged (tiny members compress absurdly well).
RATIO_FLOOR_BYTES = 1 << 20
KINDS = ("zip", "tar", "tar.gz")


class ArchiveError(ModelError):
    """An archive upload that is refused; ``member`` is the member at fault, when one is."""

    def __init__(self, message: str, member: str | None = None):
        super().__init__(message)
        self.member = member


@dataclass(frozen=True)
class ArchiveLimits:
    max_members: int = 10_000
    #: Bytes of all members together once unpacked (so of each member too).
    max_unpacked_bytes: int = 4 << 30
    #: Unpacked bytes per compressed byte, beyond which a member (or a gzip stream) is taken for a bomb.
    max_ratio: int = 100


@dataclass(frozen=True)
class Member:
    name: str   # a relative POSIX path, normalized
    size: int   # declared unpacked bytes
    is_dir: bool = False


def archive_kind(head: bytes) -> str | None:
    """The kind of archive whose file starts with ``head`` (at least 262 bytes of it), or None (a model)."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head[257:262] == b"ustar" and _tar_checksum_holds(head[:512]):
        return "tar"
    return None


def _tar_checksum_holds(header: bytes) -> bool:
    """A tar header's checksum: so that a model with "ustar" at byte 257 is not taken for an archive."""
    try:
        declared = int(header[148:156].rstrip(b"\0 ").decode("ascii") or "-1", 8)
    except ValueError:
        return False
    return declared == sum(header[:148]) + 8 * 32 + sum(header[156:512])


def check_upload(path: Path, limits: ArchiveLimits) -> str | None:
    """The archive kind of an uploaded file, its members checked, or None for a plain model file."""
    kind = file_kind(path)
    if kind is not None:
        list_members(path, kind, limits)
    return kind


def file_kind(path: Path) -> str | None:
    with open(path, "rb") as stream:
        return archive_kind(stream.read(512))


def list_members(path: Path, kind: str, limits: ArchiveLimits) -> list[Member]:
    """Every member the archive declares, checked (see the module docstring); the model member is one of them."""
    archive_bytes = os.stat(path).st_size
    seen: set[str] = set()
    members: list[Member] = []
    total = 0
    for member in _declared(path, kind, limits):
        if member.name in seen:
            raise ArchiveError(f"archive member {member.name!r} appears twice", member.name)
        seen.add(member.name)
        members.append(member)
        if len(members) > limits.max_members:
            raise ArchiveError(f"the archive has more than {limits.max_members} members; member {member.name!r} "
                               f"is one too many", member.name)
        total += member.size
        if member.size > limits.max_unpacked_bytes or total > limits.max_unpacked_bytes:
            raise ArchiveError(f"archive member {member.name!r} declares {member.size} bytes, which takes the "
                               f"archive past the unpacked limit of {_mib(limits.max_unpacked_bytes)} "
                               f"(MIRSERVE_MAX_UNPACKED_MB)", member.name)
        if kind == "tar.gz" and total > RATIO_FLOOR_BYTES and total > limits.max_ratio * archive_bytes:
            raise ArchiveError(f"archive member {member.name!r} takes the gzip stream past {limits.max_ratio} "
                               f"times its compressed size: refused as a compression bomb", member.name)
    models = [m.name for m in members if not m.is_dir and m.name.lower().endswith(".onnx")]
    if len(models) != 1:
        found = f"{len(models)}: " + ", ".join(repr(m) for m in models[:5]) if models else "none"
        raise ArchiveError(f"an archive upload must hold exactly one .onnx model (found {found})",
                           models[1] if len(models) > 1 else None)
    return members


def model_member(members: list[Member]) -> str:
    return next(m.name for m in members if not m.is_dir and m.name.lower().endswith(".onnx"))


def extract(path: Path, kind: str, destination: Path, limits: ArchiveLimits) -> Path:
    """Unpack the checked archive into ``destination`` (created here); returns the model's path in it."""
    members = list_members(path, kind, limits)
    declared = {m.name: m for m in members}
    os.mkdir(destination, 0o700)
    written = 0
    for name, source in _contents(path, kind):
        member = declared.get(name)
        if member is None:  # the listing and the reading disagree: a malformed archive
            raise ArchiveError(f"archive member {name!r} was not in the archive's member list", name)
        target = _make_parents(destination, name)
        if member.is_dir:
            _mkdir(target)
            continue
        written += _write(target, source, member, limits.max_unpacked_bytes - written)
    return destination.joinpath(*PurePosixPath(model_member(members)).parts)


def _declared(path: Path, kind: str, limits: ArchiveLimits) -> Iterator[Member]:
    if kind == "zip":
        yield from _zip_members(path, limits)
    elif kind in ("tar", "tar.gz"):
        yield from _tar_members(path, kind)
    else:
        raise ValueError(f"not an archive kind: {kind!r}")


def _zip_members(path: Path, limits: ArchiveLimits) -> Iterator[Member]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as error:
        raise ArchiveError(f"the upload is not a readable zip archive ({error})") from None
    with archive:
        for info in archive.infolist():
            name = safe_name(info.filename)
            mode = info.external_attr >> 16  # Unix mode bits, when the writer kept them
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"archive member {name!r} is a symbolic link; links are not allowed", name)
            if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ArchiveError(f"archive member {name!r} is not a regular file or a directory", name)
            if info.flag_bits & 0x1:
                raise ArchiveError(f"archive member {name!r} is encrypted", name)
            if info.file_size > RATIO_FLOOR_BYTES and info.file_size > limits.max_ratio * max(info.compress_size, 1):
                raise ArchiveError(f"archive member {name!r} would expand from {info.compress_size} to "
                                   f"{info.file_size} bytes, more than {limits.max_ratio} times: refused as a "
                                   f"compression bomb", name)
            yield Member(name, info.file_size, info.is_dir())


def _tar_members(path: Path, kind: str) -> Iterator[Member]:
    try:
        with tarfile.open(path, "r:gz" if kind == "tar.gz" else "r:") as archive:
            while True:
                info = archive.next()
                if info is None:
                    return
                name = safe_name(info.name)
                kind_error = _tar_type_error(info)
                if kind_error:
                    raise ArchiveError(f"archive member {name!r} is {kind_error}; only regular files and "
                                       f"directories are allowed", name)
                yield Member(name, info.size if info.isreg() else 0, info.isdir())
                archive.members.clear()  # tarfile keeps every header it read; the list is ours to bound
    except (tarfile.TarError, OSError, EOFError) as error:
        raise ArchiveError(f"the upload is not a readable {kind} archive ({error})") from None


def _tar_type_error(info: tarfile.TarInfo) -> str | None:
    if info.issym():
        return "a symbolic link"
    if info.islnk():
        return "a hard link"
    if info.ischr() or info.isblk():
        return "a device"
    if info.isfifo():
        return "a FIFO"
    if not (info.isreg() or info.isdir()):
        return "not a regular file"
    return None


def safe_name(raw: str) -> str:
    """A member's name as a relative POSIX path inside the extraction directory, or an ArchiveError."""
    if not raw or any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise ArchiveError(f"archive member {raw!r} has an empty name or a control character in it", raw)
    if "\\" in raw:
        raise ArchiveError(f"archive member {raw!r} has a backslash in its name", raw)
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        raise ArchiveError(f"archive member {raw!r} has an absolute path", raw)
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"archive member {raw!r} has a '..' in its path", raw)
    if not parts:
        raise ArchiveError(f"archive member {raw!r} names no file", raw)
    return "/".join(parts)


def _contents(path: Path, kind: str) -> Iterator[tuple[str, BinaryIO | None]]:
    """(name, stream of its bytes or None for a directory), in archive order."""
    if kind == "zip":
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    yield safe_name(info.filename), None
                    continue
                with archive.open(info) as stream:
                    yield safe_name(info.filename), stream
        return
    with tarfile.open(path, "r:gz" if kind == "tar.gz" else "r:") as archive:
        while (info := archive.next()) is not None:
            if _tar_type_error(info):  # list_members refused it already; a changed file is refused again
                raise ArchiveError(f"archive member {info.name!r} is {_tar_type_error(info)}", info.name)
            yield safe_name(info.name), (archive.extractfile(info) if info.isreg() else None)
            archive.members.clear()


def _make_parents(destination: Path, name: str) -> Path:
    parts = PurePosixPath(name).parts
    current = destination
    for part in parts[:-1]:
        current = current / part
        _mkdir(current)
    return current / parts[-1]


def _mkdir(path: Path) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):  # a file of that name: never follow anything else
            raise ArchiveError(f"archive member {path.name!r} is both a file and a directory", path.name) from None


def _write(target: Path, source: BinaryIO, member: Member, room: int) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(target, flags, 0o600)
    except FileExistsError:
        raise ArchiveError(f"archive member {member.name!r} appears twice", member.name) from None
    written = 0
    try:
        with os.fdopen(descriptor, "wb") as output:
            while chunk := source.read(CHUNK):
                written += len(chunk)
                if written > member.size or written > room:
                    raise ArchiveError(f"archive member {member.name!r} holds more than the {member.size} bytes "
                                       f"it declares", member.name)
                output.write(chunk)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as error:
        raise ArchiveError(f"archive member {member.name!r} cannot be read ({error})", member.name) from None
    if written != member.size:
        raise ArchiveError(f"archive member {member.name!r} holds {written} bytes, not the {member.size} it "
                           f"declares", member.name)
    return written


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"
