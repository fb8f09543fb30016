"""Fixtures for the service tests: job stores and queues on every backend, and the "server required" rule.

Tests that need PostgreSQL or Redis use the real local servers (``MIRSERVE_TEST_POSTGRES_URL``,
``MIRSERVE_TEST_REDIS_URL``, defaulting to 127.0.0.1). When a server is unreachable they skip with the reason,
unless ``MIRSERVE_REQUIRE_SERVICES=1`` (set by ``.ci/run``), where that skip becomes a failure.
"""
from __future__ import annotations

import functools
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from worker.jobs.config import JobSettings
from worker.jobs.files import JobFiles
from worker.jobs.queue import JobQueue
from worker.jobs.spec import JobSpec
from worker.jobs.store import JobStore, NewJob

POSTGRES_URL = os.environ.get("MIRSERVE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("MIRSERVE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
FAKE_ENGINE = "tests.service.engines:scripted"


@pytest.fixture(autouse=True)
def _logging_restored():
    """Commands run in-process (``main(["worker"])``) configure logging for a service: one handler on the
    root logger, on the stream of that moment. Put pytest's handlers and levels back afterwards."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in ("huey", "huey.consumer", "huey.storage")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in quiet.items():
        logging.getLogger(name).setLevel(old)


def server_unavailable(what: str, error: BaseException) -> None:
    """Skip (or, under MIRSERVE_REQUIRE_SERVICES=1, fail) a test whose server cannot be reached."""
    reason = f"{what} is unreachable ({type(error).__name__}: {error})"
    if os.environ.get("MIRSERVE_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; MIRSERVE_REQUIRE_SERVICES=1 requires it", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url():
    """A fresh schema on the local PostgreSQL server for this session, dropped afterwards."""
    import sqlalchemy

    schema = f"mirserve_test_{secrets.token_hex(4)}"
    admin = sqlalchemy.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 5})
    try:
        with admin.begin() as conn:
            conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    except Exception as error:  # noqa: BLE001 - any connection failure is "unreachable"
        admin.dispose()
        server_unavailable(f"PostgreSQL at {POSTGRES_URL}", error)
    separator = "&" if "?" in POSTGRES_URL else "?"
    url = f"{POSTGRES_URL}{separator}options=-csearch_path%3D{schema}"
    upgraded_database(url)
    yield url
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's standalone S3 server on a free local port, for the session: the AWS variables that point a
    client at it (the same test server s3fs and fsspec run their suites against)."""
    import httpx

    from tests.service.server import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                   stdout=output, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{endpoint}/moto-api/", timeout=1)
            break
        except httpx.TransportError as error:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"moto's S3 server did not start: {error}\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
    yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    process.terminate()
    process.wait(10)


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A new bucket on the moto server, with the AWS variables set for this test; yields its name."""
    import boto3

    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    bucket = f"mirserve-test-{secrets.token_hex(4)}"
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    client.close()
    return bucket


@pytest.fixture(scope="session")
def redis_url():
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except Exception as error:  # noqa: BLE001
        server_unavailable(f"Redis at {REDIS_URL}", error)
    finally:
        client.close()
    return REDIS_URL


def upgraded_database(url: str) -> str:
    """Create the job tables at ``url`` (as ``mirserve db upgrade`` does); returns the URL.

    A new SQLite file is written as a copy of one this process upgraded once: running the migrations takes some
    40 ms a database, and about a hundred tests each make one."""
    path = Path(url.removeprefix("sqlite:///"))
    if url.startswith("sqlite:///") and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_upgraded_sqlite_file())
        return url
    _upgrade(url)
    return url


@functools.cache
def _upgraded_sqlite_file() -> bytes:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "mirserve.db"
        _upgrade(f"sqlite:///{path}")
        return path.read_bytes()


def _upgrade(url: str) -> None:
    store = JobStore(url)
    try:
        store.upgrade_schema()
    finally:
        store.dispose()


def make_config(data_dir: Path, database_url: str | None = None, redis_url: str | None = None,
                **overrides) -> JobSettings:
    values = dict(data_dir=data_dir, database_url=database_url or f"sqlite:///{data_dir / 'mirserve.db'}",
                  redis_url=redis_url, queue_name=f"mirserve-test-{secrets.token_hex(4)}", engine=FAKE_ENGINE,
                  lease_seconds=3.0, heartbeat_seconds=0.1, reaper_interval_seconds=0.1, job_memory_mb=2048,
                  job_time_limit_seconds=60.0, poll_seconds=0.05, queue_wait_seconds=0.1)
    values.update(overrides)
    return JobSettings(**values)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path):
    """The job table's URL on each backend."""
    if request.param == "sqlite":
        return upgraded_database(f"sqlite:///{tmp_path / 'mirserve.db'}")
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(database_url):
    """A job store on each backend, emptied before the test (the PostgreSQL schema is shared by the session)."""
    from worker.jobs.store import metadata

    job_store = JobStore(database_url)
    with job_store.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    yield job_store
    job_store.dispose()


@pytest.fixture(params=["sqlite", "redis"])
def queue_backend(request):
    return None if request.param == "sqlite" else request.getfixturevalue("redis_url")


@pytest.fixture
def queue(queue_backend, tmp_path):
    """A job queue on each backend, with its own name so concurrent runs never share messages."""
    job_queue = JobQueue.connect(make_config(tmp_path, redis_url=queue_backend))
    yield job_queue
    job_queue.flush()
    job_queue.close()


def new_job(files: JobFiles | None = None, payload: bytes = b"not really a model", max_attempts: int = 3,
            **options) -> NewJob:
    """A NewJob (with its upload in place when ``files`` is given) whose options script the fake engine."""
    job = NewJob(input_filename="model.onnx", input_bytes=len(payload), input_sha256="0" * 64,
                 spec=JobSpec("x86/fp32/nchw", options), max_attempts=max_attempts)
    if files is not None:
        files.storage.put_bytes(files.input_key(job.id), payload)
    return job
