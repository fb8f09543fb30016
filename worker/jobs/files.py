"""Where a job's files live under the data directory, and the few operations on them.

    <data_dir>/uploads/<random>.part           an upload being received (renamed into its job when complete)
    <data_dir>/jobs/<id>/input.onnx            the uploaded model, never parsed by the API process
    <data_dir>/jobs/<id>/attempt-<n>/          everything one attempt writes: model.onnx, report.json,
                                               result.json (the child's verdict), engine.log

An attempt only ever writes inside its own directory; the job row names the attempt whose outputs were
published, so publishing is a database commit and never a file move that could happen twice.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import BinaryIO, Iterator

CHUNK = 1 << 20


class JobFiles:
    def __init__(self, data_dir: Path | str):
        self.root = Path(data_dir)
        self.jobs = self.root / "jobs"
        self.uploads = self.root / "uploads"

    def ensure(self) -> None:
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.uploads.mkdir(parents=True, exist_ok=True)

    def job_dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return self.jobs / job_id

    def input_path(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "input.onnx"

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / f"attempt-{attempt}"

    def artifact_path(self, job_id: str, attempt: int) -> Path:
        return self.attempt_dir(job_id, attempt) / "model.onnx"

    def artifact_data_path(self, job_id: str, attempt: int) -> Path:
        """The external weights the engine writes beside a model too big for one protobuf (over 2 GB)."""
        return self.artifact_path(job_id, attempt).with_name("model.onnx.data")

    def report_path(self, job_id: str, attempt: int) -> Path:
        return self.attempt_dir(job_id, attempt) / "report.json"

    def adopt_upload(self, upload: Path, job_id: str) -> Path:
        """Move a completed upload into its job directory (same file system: an atomic rename)."""
        target = self.input_path(job_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(upload, target)
        return target

    def new_attempt_dir(self, job_id: str, attempt: int) -> Path:
        """A fresh, empty directory for one attempt (a leftover from a crashed run is cleared)."""
        path = self.attempt_dir(job_id, attempt)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def remove_attempts_except(self, job_id: str, keep: int | None) -> None:
        job_dir = self.job_dir(job_id)
        if not job_dir.is_dir():
            return
        for entry in job_dir.iterdir():
            if entry.name.startswith("attempt-") and entry.name != f"attempt-{keep}":
                shutil.rmtree(entry, ignore_errors=True)

    def remove_job(self, job_id: str) -> None:
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def job_ids_on_disk(self) -> list[str]:
        return [p.name for p in self.jobs.iterdir() if p.is_dir()] if self.jobs.is_dir() else []

    def stale_uploads(self, older_than_seconds: float) -> Iterator[Path]:
        """Partial uploads an API process left behind when it died mid-request."""
        if not self.uploads.is_dir():
            return
        cutoff = time.time() - older_than_seconds
        for entry in self.uploads.iterdir():
            try:
                if entry.stat().st_mtime < cutoff:
                    yield entry
            except FileNotFoundError:
                continue


def sha256_of(path: Path) -> tuple[str, int]:
    """The hex sha256 and size of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_bounded(stream: BinaryIO, limit: int) -> bytes:
    """Read at most ``limit`` bytes; a longer stream is an error (the writer is not trusted to be small)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"file is larger than {limit} bytes")
    return data
