"""The process that runs the engine on one uploaded model, and nothing else.

An uploaded model is untrusted: onnx says resource exhaustion is outside its scope and its checker is best
effort, and the parser has had memory-safety bugs. So the engine runs here, in a child of the runner, with an
address-space limit, a lower CPU priority than the API, no core dumps, and death with its parent. It has no
database access; it speaks to the runner through two channels only:

- progress, one JSON line per pass on the original stdout (``{"index": i, "total": n, "pass": name}``);
- its verdict, ``result.json`` in the attempt directory, written atomically just before it exits.

Run as ``python -m worker.jobs.child`` with the job spec as JSON on stdin.
"""
from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from worker.process import die_with_parent

SPEC_LIMIT = 1 << 20
#: Exit codes the runner understands; anything else (or a signal) means the process died.
EXIT_OK, EXIT_JOB_FAILED = 0, 1
#: How allocation failures read in the messages of numpy, onnxruntime and the C++ runtime.
ALLOCATION_FAILURES = ("bad_alloc", "Failed to allocate", "BFCArena::AllocateRawInternal", "Cannot allocate memory",
                       "MemoryError", "Unable to allocate")


def main() -> int:
    spec = json.loads(sys.stdin.buffer.read(SPEC_LIMIT))
    _die_with_parent(spec["parent_pid"])
    _apply_limits(spec["memory_bytes"], spec.get("nice", 0))
    progress_stream = _take_stdout()
    attempt_dir = Path(spec["attempt_dir"])

    def progress(index: int, total: int, pass_name: str) -> None:
        progress_stream.write(json.dumps({"index": index, "total": total, "pass": str(pass_name)}) + "\n")
        progress_stream.flush()

    try:
        engine = load_engine(spec["engine"])
        report = engine(spec["model"], str(attempt_dir / "model.onnx"), spec["options"], progress)
        _write_json(attempt_dir / "report.json", report)
        verdict: dict[str, Any] = {"ok": True}
    except BaseException as error:  # noqa: BLE001 - every failure becomes a verdict the runner can store
        traceback.print_exc()
        verdict = {"ok": False, "error": describe_error(error, spec["memory_bytes"])}
    _write_json(attempt_dir / "result.json", verdict)
    sys.stdout.flush()
    return EXIT_OK if verdict["ok"] else EXIT_JOB_FAILED


def load_engine(reference: str) -> Callable[..., dict]:
    """Resolve ``"package.module:function"``."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"engine reference {reference!r} must look like 'package.module:function'")
    return getattr(importlib.import_module(module_name), attribute)


def describe_error(error: BaseException, memory_bytes: int) -> dict[str, Any]:
    """The stored form of a failure: user errors keep their message and field; the rest are explained."""
    from worker.errors import MirserveError

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


def _die_with_parent(parent_pid: int) -> None:
    """Be killed when the runner dies, so no engine process outlives its lease."""
    if not die_with_parent(parent_pid):  # the parent died before the request took effect
        os._exit(EXIT_JOB_FAILED)


def _apply_limits(memory_bytes: int, nice: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if nice > 0:
        os.nice(nice)


def _take_stdout():
    """Keep the real stdout for the progress protocol; anything the engine prints goes to the log instead."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return protocol


def _write_json(path: Path, data: Any) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(data), encoding="utf-8")
    os.replace(temporary, path)


if __name__ == "__main__":
    sys.exit(main())
