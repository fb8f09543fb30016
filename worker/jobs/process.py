"""Starting the engine child process and reading its progress (see ``worker.jobs.child`` for the other side)."""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import worker

MAX_LINE = 64 * 1024
#: The project root, so that ``python -m worker.jobs.child`` (and a test's engine module) import from a checkout too.
_PROJECT_ROOT = str(Path(worker.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class ChildSpec:
    engine: str
    model: str
    attempt_dir: str
    options: dict[str, Any]
    memory_bytes: int
    nice: int
    parent_pid: int


class EngineProcess:
    """One running engine child: its pid, its progress lines, and how it ended."""

    def __init__(self, spec: ChildSpec, log_path: Path):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        # glibc reserves 64 MiB of address space per thread arena; with an RLIMIT_AS limit that reservation,
        # not real use, would be what fails first.
        env.setdefault("MALLOC_ARENA_MAX", "2")
        # The engine does no BLAS work worth threads; OpenBLAS would reserve a buffer per core up front.
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        with open(log_path, "wb") as log:
            self._popen = subprocess.Popen(
                [sys.executable, "-m", "worker.jobs.child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, env=env, close_fds=True, start_new_session=True)
        self.pid = self._popen.pid
        try:
            self._popen.stdin.write(json.dumps(asdict(spec)).encode())
            self._popen.stdin.close()
        except BrokenPipeError:  # it died at once; poll() will say how
            pass
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._popen.stdout, selectors.EVENT_READ)
        self._buffer = b""
        self._eof = False

    def read_progress(self, timeout: float) -> list[tuple[int, int, str]]:
        """Progress reports that arrived within ``timeout`` seconds (an empty list if none did)."""
        if self._eof:  # nothing more will come; wait as select would have, rather than spin
            time.sleep(timeout)
            return []
        reports = []
        for _key, _mask in self._selector.select(timeout):
            chunk = os.read(self._popen.stdout.fileno(), 65536)
            if not chunk:
                self._eof = True
                self._selector.unregister(self._popen.stdout)
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_LINE:  # not our protocol: drop it rather than grow without bound
            self._buffer = b""
        for line in lines:
            report = _parse_progress(line)
            if report is not None:
                reports.append(report)
        return reports

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._popen.wait(timeout)

    def kill(self) -> None:
        """Kill the child and anything it started (it leads its own process group)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._popen.wait()

    def close(self) -> None:
        self._selector.close()
        self._popen.stdout.close()


def _parse_progress(line: bytes) -> tuple[int, int, str] | None:
    try:
        data = json.loads(line)
        return int(data["index"]), int(data["total"]), str(data["pass"])
    except (ValueError, KeyError, TypeError):
        return None


def describe_exit(returncode: int) -> str:
    """``killed by SIGKILL`` or ``exit code 3``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
