"""Running ``python -m app.cli serve`` as a real process for end-to-end tests (and reading its job table)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.waiting import wait_until
from worker.jobs.store import Job, JobStore

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One ``mirserve serve`` (API + embedded worker) on a free port with its own data directory.

    Its result cache is off unless a test sets ``cache``: the tests that share a server submit the same model
    and options again and again, and each needs a job that runs (``tests/service/test_result_cache.py`` tests
    the cache).
    """

    def __init__(self, data_dir: Path, command: str = "serve", **settings):
        self.data_dir = Path(data_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "MIRSERVE_DATA_DIR": str(self.data_dir),
                    "MIRSERVE_PORT": str(self.port), "MIRSERVE_LOG_LEVEL": "warning", "MIRSERVE_CACHE": "0"}
        self.env.update({f"MIRSERVE_{k.upper()}": str(v) for k, v in settings.items()})
        self.command = command
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-{command}.log"
        self.process: subprocess.Popen | None = None
        self.client = httpx.Client(base_url=self.url, timeout=30)
        self._store: JobStore | None = None

    def __enter__(self) -> "Server":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "app.cli", self.command], cwd=REPO, env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        if self._store is not None:
            self._store.dispose()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until(self._ready, timeout, f"mirserve {self.command} to be ready", self.log)

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"mirserve {self.command} exited with {self.process.returncode}:\n{self.log()}")
        try:
            return self.client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    @property
    def store(self) -> JobStore:
        """The server's job table, read directly (for pids and attempt details the API does not show)."""
        if self._store is None:
            self._store = JobStore(f"sqlite:///{self.data_dir.resolve() / 'mirserve.db'}")
        return self._store

    def job_row(self, job_id: str) -> Job:
        return self.store.get(job_id)

    def submit(self, model: Path | bytes, places: str, options: dict | None = None, filename: str | None = None):
        import json

        content = model.read_bytes() if isinstance(model, Path) else model
        name = filename or (model.name if isinstance(model, Path) else "model.onnx")
        data = {"places": places}
        if options:
            data["options"] = json.dumps(options)
        return self.client.post("/optimize", files={"model": (name, content)}, data=data)

    def wait_for(self, job_id: str, statuses=("succeeded", "failed", "canceled"), timeout: float = 120) -> dict:
        return wait_until(lambda: (job := self.client.get(f"/jobs/{job_id}").json())["status"] in statuses and job,
                          timeout, f"job {job_id} to be {' or '.join(statuses)}", self.log)


class ServiceProcess:
    """One ``mirserve`` process of a scaled-out service (``api`` or ``worker``), with the given ``MIRSERVE_*``
    settings on top of this environment; its output goes to ``log_path``."""

    def __init__(self, command: list[str], settings: dict[str, object], log_path: Path):
        self.command = command
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "MIRSERVE_LOG_LEVEL": "info",
                    "MIRSERVE_LOG_FORMAT": "text"}
        self.env.update({f"MIRSERVE_{k.upper()}": str(v) for k, v in settings.items() if v is not None})
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> "ServiceProcess":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "app.cli", *self.command], cwd=REPO,
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def terminate(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode
