"""A real HTTP service for the client's tests: uvicorn on a free port in this process, an embedded worker
running the scripted engine (``tests.service.engines:scripted``), on a temporary SQLite job table and queue."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.service.conftest import FAKE_ENGINE, upgraded_database
from tests.service.server import free_port
from tests.waiting import wait_until

#: What the scripted engine "optimizes": it copies the upload through, so the artifact is these bytes.
MODEL_BYTES = b"\x08\x07" + b"pretend this is an ONNX model " * 4000


@dataclass
class Service:
    url: str
    settings: object
    worker: object = None

    def start_worker(self) -> None:
        from worker.jobs.consumer import JobWorker

        self.worker = JobWorker(self.settings)
        self.worker.start()

    def stop_worker(self) -> None:
        self.worker.stop(timeout=5)

    @contextmanager
    def scripted(self, client, model: Path, **script):
        """Submit a job whose stored options script the engine (the API would refuse such options), with no
        worker running until the script is in place; yields the job. It opts out of the result cache: an
        earlier job's result for the same model must not answer it."""
        from worker.jobs.db import write_transaction
        from worker.jobs.store import jobs_table

        self.stop_worker()
        try:
            job = client.submit(model, cache=False)
            with write_transaction(self.worker.store.engine) as conn:
                conn.execute(jobs_table.update().where(jobs_table.c.id == job.id)
                             .values(spec={"places": "x86/fp32/nchw", "options": script, "cache": False}))
        finally:
            self.start_worker()
        yield job


@contextmanager
def running_service(data: Path, **overrides):
    """uvicorn on a free port in a thread and an embedded worker, on ``data``; yields the Service."""
    import uvicorn

    from app.main import create_app
    from app.settings import Settings

    settings = Settings(data_dir=data, engine=FAKE_ENGINE, lease_seconds=3, heartbeat_seconds=0.3,
                        reaper_interval_seconds=0.5, job_memory_mb=1024, **overrides)
    upgraded_database(settings.effective_database_url)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 20, "the test server to start")
    assert server.started, "the test server did not start"
    running = Service(f"http://127.0.0.1:{port}", settings)
    running.start_worker()
    try:
        yield running
    finally:
        running.stop_worker()
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("client") / "data") as running:
        yield running


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "det.onnx"
    path.write_bytes(MODEL_BYTES)
    return path
