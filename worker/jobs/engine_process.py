"""Starting a job's engine process and watching it (``worker.jobs.child`` is the other side).

Engine processes are forked, one per job, from a fork server (``multiprocessing``'s forkserver) that has
imported the engine, its plugins and the job's engine function once (``worker.jobs.preload``): a job starts
in milliseconds instead of paying half a second of imports, and still gets a fresh process of its own, with
its own limits, working directory and sandbox, that is killed whole on cancel and exits after the job. The
fork server is a child of the worker; if it dies, the next job starts a new one. With
``MIRSERVE_WARM_ENGINES=0`` each engine process is a fresh interpreter instead (``spawn``), which imports
everything for its one job: slower, but nothing is shared with a fork server.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.spawn
import os
import signal
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait
from typing import Any

from worker.jobs import child

MAX_MESSAGE = 64 * 1024
WARM, COLD = multiprocessing.get_context("forkserver"), multiprocessing.get_context("spawn")
#: Engine processes are named so; see ``_without_main``.
NAME_PREFIX = "mirserve-engine "


def _without_main(get_preparation_data):
    """``multiprocessing`` makes every new process (forked from the fork server, or spawned) import the
    parent's ``__main__`` again before its target runs: under ``python -m app.cli worker`` that is the whole
    HTTP app, about a second per job. An engine process needs nothing of it (its target is
    ``worker.jobs.child.run``), so its preparation data leaves the main module out; other processes keep
    theirs. ``get_preparation_data`` is looked up at each start, so wrapping it is enough."""

    def prepare(name: str) -> dict:
        data = get_preparation_data(name)
        if name.startswith(NAME_PREFIX):
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
        return data

    prepare.wrapped = get_preparation_data
    return prepare


if not hasattr(multiprocessing.spawn.get_preparation_data, "wrapped"):
    multiprocessing.spawn.get_preparation_data = _without_main(multiprocessing.spawn.get_preparation_data)


@dataclass(frozen=True)
class ChildSpec:
    engine: str
    model: str
    attempt_dir: str
    options: dict[str, Any]
    memory_bytes: int
    nice: int
    #: The service's data directory: the engine process may not read it, but for its input and attempt.
    data_dir: str
    #: What an archive upload may unpack to (``worker.jobs.archive``).
    max_unpacked_bytes: int = 4 << 30


def prepare(engine: str, warm: bool = True) -> None:
    """Get ready to start engine processes: with ``warm``, start the fork server now, with the engine and
    ``engine`` (``module:function``) imported, so that the first job does not wait for it (later calls, from
    another worker in this process, keep the running one)."""
    # Read by glibc and OpenBLAS when they load, so they must be in the engine processes' environment:
    # glibc reserves 64 MiB of address space per thread arena, which under RLIMIT_AS, not real use, would be
    # what fails first; the engine does no BLAS work worth threads, and OpenBLAS would start one per core.
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if warm:
        WARM.set_forkserver_preload(["worker.jobs.preload", engine.partition(":")[0]])
        multiprocessing.forkserver.ensure_running()


class EngineProcess:
    """One running engine process: its pid, its progress messages, and how it ended."""

    def __init__(self, spec: ChildSpec, warm: bool = True):
        context = WARM if warm else COLD
        self._progress, progress_end = context.Pipe(duplex=False)
        lifeline_end, self._lifeline = context.Pipe(duplex=False)
        self._process = context.Process(target=child.run, args=(asdict(spec), progress_end, lifeline_end),
                                         name=f"{NAME_PREFIX}{os.path.basename(spec.attempt_dir)}", daemon=True)
        try:
            self._process.start()
        finally:  # the engine process holds its own ends now
            progress_end.close()
            lifeline_end.close()
        self.pid = self._process.pid
        self._eof = False

    def read_progress(self, timeout: float) -> list[tuple[int, int, str]]:
        """Progress reports that arrived within ``timeout`` seconds (an empty list if none did)."""
        waiting = [self._process.sentinel] if self._eof else [self._progress, self._process.sentinel]
        reports = []
        if self._progress in wait(waiting, timeout):
            while not self._eof and self._progress.poll():
                try:
                    report = _parse_progress(self._progress.recv_bytes(MAX_MESSAGE))
                except (EOFError, OSError):  # it exited, or sent something that is not our protocol
                    self._eof = True
                    break
                if report is not None:
                    reports.append(report)
        return reports

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._process.join(timeout)
        return self._process.exitcode

    def kill(self) -> None:
        """Kill the engine process and anything it started (it leads its own process group)."""
        for target in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
            try:  # the group exists once the process has called setsid(); before that, the process alone
                target()
            except (ProcessLookupError, PermissionError):
                continue
            break
        self._process.join()

    def close(self) -> None:
        self._progress.close()
        self._lifeline.close()
        if self._process.exitcode is not None:
            self._process.close()


def _parse_progress(message: bytes) -> tuple[int, int, str] | None:
    try:
        data = json.loads(message)
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
