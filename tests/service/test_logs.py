"""The service's logs are JSON lines: a failed job's carry its id, attempt, pass and reason; the access log has
its fields; huey's chatter stays out at info."""
from __future__ import annotations

import io
import json
import logging
import time

import pytest

from worker.jobs.logs import configure_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_failed_job_is_logged_in_json_with_its_id_and_reason(real_server):
    job = real_server.submit(b"this is not an ONNX model", "x86/fp32/nchw", filename="broken.onnx").json()
    assert real_server.wait_for(job["id"])["status"] == "failed"
    deadline = time.monotonic() + 10
    while True:
        records = [r for r in json_lines(real_server.log_path.read_text()) if r.get("job_id") == job["id"]]
        failed = [r for r in records if r["message"] == "job failed"]
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    (record,) = failed
    assert record["level"] == "WARNING" and record["logger"] == "mirserve.runner" and record["attempt"] == 1
    assert record["error_type"] == "ModelError" and record["field"] == "model"
    assert record["reason"].startswith("broken.onnx: not an ONNX model")  # the user's name, not a server path
    assert "time" in record and str(real_server.data_dir) not in json.dumps(record)


def test_job_fields_become_json_fields_and_text_keeps_them(restore_logging):
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    logging.getLogger("mirserve.runner").warning("job failed", extra={"job_id": "j1", "attempt": 2,
                                                                        "pass": "constant_folding",
                                                                        "reason": "ünicode kept"})
    (record,) = json_lines(stream.getvalue())
    assert {k: record[k] for k in ("message", "level", "logger", "job_id", "attempt", "pass", "reason")} == {
        "message": "job failed", "level": "WARNING", "logger": "mirserve.runner", "job_id": "j1", "attempt": 2,
        "pass": "constant_folding", "reason": "ünicode kept"}
    stream = io.StringIO()
    configure_logging("info", "text", stream)
    logging.getLogger("mirserve.runner").info("attempt started", extra={"job_id": "j1", "attempt": 1})
    assert stream.getvalue().rstrip().endswith("mirserve.runner INFO attempt started job_id=j1 attempt=1")


def test_the_access_log_is_at_info_with_its_fields_and_huey_is_quiet(restore_logging):
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/jobs?limit=2",
                                             "1.1", 200)
    logging.getLogger("huey.consumer").info("Executing mirserve.run_job: 123")
    (record,) = json_lines(stream.getvalue())
    assert record["logger"] == "uvicorn.access" and record["level"] == "INFO"
    assert (record["client"], record["method"], record["path"], record["status"]) == ("127.0.0.1:5000", "GET",
                                                                                      "/jobs?limit=2", 200)
    configure_logging("debug", "json", io.StringIO())
    assert logging.getLogger("huey").getEffectiveLevel() == logging.DEBUG
