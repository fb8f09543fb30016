"""The process that runs the engine on one uploaded model, and nothing else.

An uploaded model is untrusted: onnx says resource exhaustion is outside its scope and its checker is best
effort, and the parser has had memory-safety bugs. So the engine runs here, in a process of its own for each
job, forked from a fork server that has already imported the engine (``worker.jobs.engine_process``), with an
address-space limit, a lower CPU priority than the API, no core dumps, its own process group (killed whole
on cancel or timeout), its attempt directory as working directory and HOME, and, where the kernel has
Landlock, nothing else of the file system within reach (``worker.jobs.sandbox``). It has no database access
and speaks to the runner through its three channels only:

- progress, one JSON message per pass (``{"index": i, "total": n, "pass": name}``) on the progress pipe;
- its verdict, ``result.json`` in the attempt directory, written atomically just before it exits (on success
  with the identity of the engine that ran, for the result cache);
- the lifeline, a pipe only the runner's process writes to: when it closes (the worker died, however) the
  engine process kills its whole group at once, so no engine outlives its lease.
"""
from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import sys
import tempfile
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from worker.jobs import archive, sandbox

#: Exit codes the runner understands; anything else (or a signal) means the process died.
EXIT_OK, EXIT_JOB_FAILED = 0, 1
#: How allocation failures read in the messages of numpy, onnxruntime and the C++ runtime.
ALLOCATION_FAILURES = ("bad_alloc", "Failed to allocate", "BFCArena::AllocateRawInternal", "Cannot allocate memory",
                       "MemoryError", "Unable to allocate")


def run(spec: dict[str, Any], progress_pipe: Connection, lifeline: Connection) -> None:
    """The engine process's whole life (a ``multiprocessing`` target); it ends in ``os._exit``."""
    os.setsid()  # a process group of its own: the runner kills it and whatever it started at once
    attempt_dir = Path(spec["attempt_dir"])
    _log_to(attempt_dir / "engine.log")
    _apply_limits(spec["memory_bytes"], spec.get("nice", 0))
    os.chdir(attempt_dir)
    os.environ.update(sandbox.private_environment({}, attempt_dir))
    tempfile.tempdir = None  # computed again from TMPDIR, should the fork server have asked already
    print(sandbox.restrict(model=Path(spec["model"]), attempt_dir=attempt_dir, hidden=Path(spec["data_dir"]),
                           extra_read=_plugin_paths()), file=sys.stderr, flush=True)
    _watch_lifeline(lifeline)

    def progress(index: int, total: int, pass_name: str) -> None:
        progress_pipe.send_bytes(json.dumps({"index": index, "total": total, "pass": str(pass_name)}).encode())

    try:
        engine = load_engine(spec["engine"])
        model, unpacked = _unpacked(Path(spec["model"]), attempt_dir, spec.get("max_unpacked_bytes"))
        extra = {"external_data_dir": str(unpacked)} if unpacked is not None else {}
        report = engine(str(model), str(attempt_dir / "model.onnx"), spec["options"], progress, **extra)
        _write_json(attempt_dir / "report.json", report)
        verdict: dict[str, Any] = {"ok": True, "engine": _engine_identity()}
    except BaseException as error:  # noqa: BLE001 - every failure becomes a verdict the runner can store
        traceback.print_exc()
        verdict = {"ok": False, "error": describe_error(error, spec["memory_bytes"])}
    _write_json(attempt_dir / "result.json", verdict)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OK if verdict["ok"] else EXIT_JOB_FAILED)  # no interpreter teardown: runtimes may hang in it


def _engine_identity() -> dict[str, Any] | None:
    """The identity of the engine that made the result (the result cache's key names it); None when it
    cannot be told, and then the result is not offered for reuse."""
    from worker.jobs.result_cache import engine_identity

    try:
        return engine_identity()
    except Exception:  # noqa: BLE001 - not knowing only costs the cache
        traceback.print_exc()
        return None


def _unpacked(model: Path, attempt_dir: Path, max_unpacked_bytes: int | None) -> tuple[Path, Path | None]:
    """The model to optimize and the directory its external data may come from: an archive upload is unpacked
    here, inside the sandbox, into ``<attempt>/input/`` (the model's own directory there is that directory)."""
    kind = archive.file_kind(model)
    if kind is None:
        return model, None
    limits = archive.ArchiveLimits(max_unpacked_bytes=max_unpacked_bytes or archive.ArchiveLimits.max_unpacked_bytes)
    unpacked = archive.extract(model, kind, attempt_dir / "input", limits)
    return unpacked, unpacked.parent


def load_engine(reference: str) -> Callable[..., dict]:
    """Resolve ``"package.module:function"``."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"engine reference {reference!r} must look like 'package.module:function'")
    return getattr(importlib.import_module(module_name), attribute)


def describe_error(error: BaseException, memory_bytes: int) -> dict[str, Any]:
    """The stored form of a failure: user errors keep their message and field; the rest are explained."""
    from worker.engine.errors import MirserveError

    if memory_bytes > 0 and (isinstance(error, MemoryError) or any(m in str(error) for m in ALLOCATION_FAILURES)):
        # Under RLIMIT_AS an allocation failure surfaces wherever it happens: numpy, onnxruntime's arena, or a
        # verification child whose crash the engine reports as a VerificationError.
        limit = memory_bytes // (1 << 20)
        return {"type": "ResourceLimitError", "field": None,
                "message": f"the optimization needed more memory than the job limit of {limit} MiB "
                           f"({type(error).__name__}: {str(error)[:200]})"}
    if isinstance(error, MirserveError):
        return {"type": type(error).__name__, "message": str(error), "field": error.field}
    return {"type": "InternalError", "field": None,
            "message": f"the engine failed unexpectedly ({type(error).__name__}: {error})"}


def _log_to(path: Path) -> None:
    """Whatever the engine and the libraries under it print goes to the attempt's log."""
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _apply_limits(memory_bytes: int, nice: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if nice > 0:
        os.nice(nice)  # per thread on Linux: before any thread starts, so that all inherit it


def _watch_lifeline(lifeline: Connection) -> None:
    """Kill this process group when the runner's end of the lifeline closes (the runner never writes)."""

    def watch() -> None:
        try:
            lifeline.recv_bytes(1)
        except (EOFError, OSError):
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def _plugin_paths() -> list[str]:
    """Plugin files and directories the operator configured: the engine process loads them, so it reads them."""
    found = []
    for variable in ("MIRSERVE_PLUGIN_PATH", "MIRSERVE_PLUGIN_FILES"):
        found.extend(p for p in os.environ.get(variable, "").split(os.pathsep) if p)
    return found


def _write_json(path: Path, data: Any) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(data), encoding="utf-8")
    os.replace(temporary, path)
