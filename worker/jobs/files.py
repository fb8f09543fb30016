"""Where a job's files live: keys in the store (``worker.jobs.storage``), and a worker's scratch directory.

In the store (under the data directory, or the bucket's prefix):

    jobs/<id>/input.onnx                 the uploaded model, never parsed by the API process
    jobs/<id>/attempt-<n>/model.onnx     the optimized model of attempt n (model.onnx.data beside it when the
                                         weights are external), published by one database commit
    jobs/<id>/attempt-<n>/report.json    its report, as published (it names no server path)
    jobs/<id>/attempt-<n>/engine.log     the end of what its engine process printed
    jobs/<id>/attempt-<n>/graph.svg      the picture of its graph, drawn when first asked for
    jobs/<id>/attempt-0/...              a cached job's own copy of its source's model and report

On the worker's disk, never shared (``MIRSERVE_SCRATCH_DIR``, default ``<data dir>/scratch``):

    <scratch>/<worker id>/<id>/attempt-<n>/   where the engine process works: its output, result.json (its
                                              verdict), engine.log, its HOME and TMPDIR

An attempt writes only its own keys; the job row names the attempt whose outputs were published, so
publishing is a database commit and never a move that could happen twice.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from worker.jobs.storage import Storage

CHUNK = 1 << 20
#: A cached job's artifact is a copy made without running an attempt.
CACHED_ATTEMPT = 0


class JobFiles:
    def __init__(self, storage: Storage, scratch: Path | None = None):
        self.storage = storage
        #: This worker's scratch directory (None in an API process).
        self.scratch = scratch

    @staticmethod
    def job_prefix(job_id: str) -> str:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return f"jobs/{job_id}/"

    def input_key(self, job_id: str) -> str:
        return self.job_prefix(job_id) + "input.onnx"

    def attempt_prefix(self, job_id: str, attempt: int) -> str:
        return self.job_prefix(job_id) + f"attempt-{attempt}/"

    def artifact_key(self, job_id: str, attempt: int) -> str:
        return self.attempt_prefix(job_id, attempt) + "model.onnx"

    def artifact_data_key(self, job_id: str, attempt: int) -> str:
        """The external weights the engine writes beside a model too big for one protobuf (over 2 GB)."""
        return self.artifact_key(job_id, attempt) + ".data"

    def report_key(self, job_id: str, attempt: int) -> str:
        return self.attempt_prefix(job_id, attempt) + "report.json"

    def log_key(self, job_id: str, attempt: int) -> str:
        return self.attempt_prefix(job_id, attempt) + "engine.log"

    def graph_key(self, job_id: str, attempt: int) -> str:
        """The picture of the published graph, drawn by the API on first request."""
        return self.attempt_prefix(job_id, attempt) + "graph.svg"

    def remove_job(self, job_id: str) -> None:
        self.storage.delete_prefix(self.job_prefix(job_id))

    def remove_attempts_except(self, job_id: str, keep: int | None) -> None:
        for name in self.storage.children(self.job_prefix(job_id)):
            if name.startswith("attempt-") and name != f"attempt-{keep}":
                self.storage.delete_prefix(f"{self.job_prefix(job_id)}{name}/")

    def job_ids(self) -> list[str]:
        return self.storage.children("jobs/")

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        """The attempt's directory in this worker's scratch."""
        if self.scratch is None:
            raise RuntimeError("an API process has no scratch directory")
        self.job_prefix(job_id)  # checks the id
        return self.scratch / job_id / f"attempt-{attempt}"


#: Extensions of archive uploads, longest first: ``model.tar.gz`` gives ``model.opt.onnx``.
ARCHIVE_EXTENSIONS = (".tar.gz", ".tgz", ".tar", ".zip")


def artifact_name(input_filename: str) -> str:
    """The optimized model's download name: the upload's name with ``.opt.onnx`` for its extension."""
    lowered = input_filename.lower()
    for extension in ARCHIVE_EXTENSIONS:
        if lowered.endswith(extension):
            return f"{input_filename[:-len(extension)] or 'model'}.opt.onnx"
    return f"{input_filename.rsplit('.', 1)[0] or 'model'}.opt.onnx"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` so that a reader sees the old file or the whole new one, never a part."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


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


def tail(path: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of a file (all of a shorter one; nothing of a missing one)."""
    try:
        with open(path, "rb") as stream:
            stream.seek(max(0, os.fstat(stream.fileno()).st_size - limit))
            return stream.read(limit)
    except FileNotFoundError:
        return b""
