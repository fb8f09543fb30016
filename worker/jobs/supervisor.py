"""Keeping one worker process running beside the API: what ``mirserve serve`` embeds."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import worker

log = logging.getLogger("mirserve.serve")
RESTART_DELAY_SECONDS = 1.0
WORKER_STOP_SECONDS = 15.0
#: The project root, so that ``python -m worker.jobs`` imports this checkout even where it is not installed.
PROJECT_ROOT = str(Path(worker.__file__).resolve().parent.parent)


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the project root first on ``PYTHONPATH``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
    return env


class WorkerSupervisor:
    """Runs ``python -m worker.jobs`` as a child that dies with this process; restarts it when it dies,
    stops it (SIGTERM, then SIGKILL after a grace period) on ``stop()``."""

    def __init__(self, arguments: list[str] = (), stop_seconds: float = WORKER_STOP_SECONDS):
        self.command = [sys.executable, "-m", "worker.jobs", "--parent-pid", str(os.getpid()), *arguments]
        self.stop_seconds = stop_seconds
        self.process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        self.process = subprocess.Popen(self.command, env=child_environment())
        log.info("started worker process %d", self.process.pid)

    def _watch(self) -> None:
        while not self._stopping.is_set():
            code = self.process.poll()
            if code is not None and not self._stopping.is_set():
                log.warning("worker process %d exited (%s); restarting it", self.process.pid, code)
                if self._stopping.wait(RESTART_DELAY_SECONDS):
                    return
                self._spawn()
            self._stopping.wait(0.5)

    def stop(self) -> None:
        self._stopping.set()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(self.stop_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
