"""Where uploads, artifacts and reports are kept: one small interface, a local directory or an S3 bucket.

Objects are named by keys (``jobs/<id>/input.onnx``, see ``worker.jobs.files``). Two backends:

- ``LocalStorage``: the data directory (the default, and what ``mirserve serve`` uses); a key is a file under
  it, written under a temporary name and renamed when complete, so no reader sees half an object;
- ``S3Storage`` (``worker.jobs.s3``): any S3-compatible store (AWS, MinIO, Ceph), chosen with
  ``MIRSERVE_STORAGE_URL=s3://bucket/prefix``; then nothing but the database, the queue and the bucket is
  shared between hosts, and each worker works in a private scratch directory.
"""
from __future__ import annotations

import os
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

CHUNK = 1 << 20
PARTIAL_SUFFIX = ".part"


class ObjectMissing(FileNotFoundError):
    """No object has this key."""


class ObjectTooLarge(ValueError):
    """The object is larger than the reader allows."""


@dataclass
class StoredObject:
    """An object opened for streaming: its size and its bytes, in chunks."""

    size: int
    chunks: Iterator[bytes]


class ObjectWriter(ABC):
    """An object being written in pieces (an upload as it arrives). Nothing is visible under the key until
    ``commit``; ``abort`` (or no commit) leaves nothing behind but what a sweep removes."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Take the next bytes; cheap, may keep them in memory until ``flush``."""

    @property
    def due(self) -> bool:
        """Enough is buffered that ``flush`` should run now (it blocks: off the event loop)."""
        return False

    def flush(self) -> None:
        """Send what is buffered."""

    @abstractmethod
    def commit(self) -> None:
        """Make the object visible under its key, whole."""

    @abstractmethod
    def abort(self) -> None:
        """Throw away what was written."""


class Storage(ABC):
    """The operations the service needs of a store, and nothing more."""

    #: For readiness and logs: "local" or "s3".
    kind: str

    @abstractmethod
    def writer(self, key: str) -> ObjectWriter:
        """Write an object in pieces (uploads)."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Store a local file under ``key``; the file may be moved (it is the caller's scratch)."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Copy the object to a local file."""

    @abstractmethod
    def read_bytes(self, key: str, limit: int) -> bytes:
        """The whole object; ObjectTooLarge beyond ``limit`` bytes."""

    @abstractmethod
    def open(self, key: str, start: int = 0) -> StoredObject:
        """The object for streaming (downloads): its whole size, and its bytes from ``start`` on (a resumed
        download's Range)."""

    def local_path(self, key: str) -> Path | None:
        """The object's file when the store is a local directory (no copy needed), else None."""
        return None

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def copy(self, source: str, target: str) -> None:
        """A copy under another key that outlives the source (the result cache)."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object whose key starts with ``prefix``; returns how many."""

    @abstractmethod
    def children(self, prefix: str) -> list[str]:
        """The names one level below ``prefix`` (``jobs/`` -> job ids)."""

    @abstractmethod
    def newest_change(self, prefix: str) -> float | None:
        """When something under ``prefix`` was last written (Unix time), None when nothing is there."""

    @abstractmethod
    def sweep_partial(self, older_than_seconds: float) -> int:
        """Throw away writes abandoned for that long (an API process that died mid-upload); returns how many."""

    def presign(self, key: str, filename: str, expires_seconds: int) -> str | None:
        """A URL a client can download the object from directly, or None when the store has none."""
        return None

    @abstractmethod
    def ping(self) -> None:
        """Raise when the store cannot be written."""

    def close(self) -> None:
        pass


class LocalStorage(Storage):
    """Objects as files under ``root`` (the data directory)."""

    kind = "local"

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"bad storage key {key!r}")
        return self.root.joinpath(*parts)

    def writer(self, key: str) -> ObjectWriter:
        return _LocalWriter(self.path(key))

    def put_file(self, key: str, path: Path) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, target)  # scratch in the data directory: a rename
        except OSError:  # another file system: copy under a temporary name, then rename
            partial = _partial(target)
            shutil.copyfile(path, partial)
            os.replace(partial, target)

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = _partial(target)
        partial.write_bytes(data)
        os.replace(partial, target)

    def get_file(self, key: str, path: Path) -> None:
        try:
            shutil.copyfile(self.path(key), path)
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    def read_bytes(self, key: str, limit: int) -> bytes:
        try:
            with open(self.path(key), "rb") as stream:
                data = stream.read(limit + 1)
        except FileNotFoundError:
            raise ObjectMissing(key) from None
        if len(data) > limit:
            raise ObjectTooLarge(f"{key} is larger than {limit} bytes")
        return data

    def open(self, key: str, start: int = 0) -> StoredObject:
        try:
            stream = open(self.path(key), "rb")
        except FileNotFoundError:
            raise ObjectMissing(key) from None
        stream.seek(start)
        return StoredObject(os.fstat(stream.fileno()).st_size, _chunks(stream))

    def local_path(self, key: str) -> Path | None:
        return self.path(key)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def copy(self, source: str, target: str) -> None:
        destination = self.path(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = _partial(destination)
        try:
            os.link(self.path(source), partial)  # the same bytes, one more name: deleting the source keeps them
        except FileNotFoundError:
            raise ObjectMissing(source) from None
        except OSError:
            shutil.copyfile(self.path(source), partial)
        os.replace(partial, destination)

    def delete_prefix(self, prefix: str) -> int:
        base = self.path(prefix.rstrip("/"))
        if base.is_dir():
            count = sum(1 for p in base.rglob("*") if p.is_file())
            shutil.rmtree(base, ignore_errors=True)
            return count
        if base.is_file():
            base.unlink(missing_ok=True)
            return 1
        return 0

    def children(self, prefix: str) -> list[str]:
        base = self.path(prefix.rstrip("/"))
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []

    def newest_change(self, prefix: str) -> float | None:
        base = self.path(prefix.rstrip("/"))
        try:
            times = [base.stat().st_mtime] + [p.stat().st_mtime for p in base.rglob("*")]
        except FileNotFoundError:
            return None
        return max(times)

    def sweep_partial(self, older_than_seconds: float) -> int:
        cutoff = time.time() - older_than_seconds
        removed = 0
        for partial in list(self.root.rglob(f".*-*{PARTIAL_SUFFIX}")):  # as _partial names them
            try:
                if partial.stat().st_mtime < cutoff:
                    partial.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
            try:
                partial.parent.rmdir()  # the directory the write made, when nothing else is in it
            except OSError:
                pass
        return removed

    def ping(self) -> None:
        probe = _partial(self.root / f".ready-{os.getpid()}-{time.monotonic_ns()}")
        probe.write_bytes(b"ok")
        probe.unlink()


class _LocalWriter(ObjectWriter):
    """A file under a temporary name, renamed into place on commit; nothing is created before the first write."""

    def __init__(self, target: Path):
        self.target = target
        self.partial = _partial(target)
        self.stream = None

    def write(self, data: bytes) -> None:
        if self.stream is None:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.stream = open(self.partial, "wb")
        self.stream.write(data)

    def commit(self) -> None:
        if self.stream is None:
            self.write(b"")
        self.stream.close()
        os.replace(self.partial, self.target)

    def abort(self) -> None:
        if self.stream is None:
            return
        self.stream.close()
        self.partial.unlink(missing_ok=True)
        try:
            self.target.parent.rmdir()  # the directory the write made, when nothing else is in it
        except OSError:
            pass


def _partial(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place (a sweep removes abandoned ones)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{time.monotonic_ns()}{PARTIAL_SUFFIX}")


def _chunks(stream) -> Iterator[bytes]:
    with stream:
        while chunk := stream.read(CHUNK):
            yield chunk


def open_storage(url: str | None, data_dir: Path) -> Storage:
    """The store ``MIRSERVE_STORAGE_URL`` names: ``s3://bucket/prefix``, or the data directory when unset."""
    if not url:
        return LocalStorage(data_dir)
    if url.startswith("s3://"):
        from worker.jobs.s3 import S3Storage

        return S3Storage.from_url(url)
    raise ValueError(f"MIRSERVE_STORAGE_URL must be s3://bucket/prefix (or unset for the data directory), "
                     f"not {url!r}")
