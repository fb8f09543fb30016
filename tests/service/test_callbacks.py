"""Notifications: a signed POST to the job's callback_url when it ends, however it ends, retried with backoff;
only allowed hosts; a slow receiver holds up no job."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import FAKE_ENGINE, upgraded_database
from tests.service.test_api import wait_done
from tests.waiting import wait_until
from worker.jobs import callbacks
from worker.jobs.callbacks import CallbackRefused, check_callback_url, sign, verify_signature

SECRET = "deployment-secret"


class Receiver:
    """A local HTTP endpoint that records what it is sent and answers with the scripted statuses."""

    def __init__(self):
        self.received: list[tuple[dict, bytes]] = []
        self.statuses: list[int] = []
        #: Requests that reached the handler, answered or not.
        self.arrived: list[bytes] = []
        #: Cleared, the receiver holds every request it gets (unanswered) until it is set again.
        self.answering = threading.Event()
        self.answering.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.arrived.append(body)
                outer.answering.wait(30)
                outer.received.append((dict(self.headers), body))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        # serve_forever looks for shutdown() every poll_interval: its default (0.5 s) was each test's teardown.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def wait(self, count: int, timeout: float = 20, what: str = "received") -> list:
        deadline = time.monotonic() + timeout
        while len(getattr(self, what)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return getattr(self, what)

    def close(self):
        self.answering.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


@pytest.fixture
def service(tmp_path, monkeypatch):
    from app.main import create_app
    from app.settings import Settings
    from worker.jobs.consumer import JobWorker

    monkeypatch.setattr(callbacks, "FIRST_WAIT_SECONDS", 0.2)
    settings = Settings(data_dir=tmp_path / "data", engine=FAKE_ENGINE, lease_seconds=3, heartbeat_seconds=0.3,
                        reaper_interval_seconds=0.5, callback_allow="127.0.0.1", callback_secret=SECRET)
    upgraded_database(settings.effective_database_url)
    with TestClient(create_app(settings)) as client:
        worker = JobWorker(settings)
        worker.notifier.interval = 0.1
        yield client, worker
        worker.stop(timeout=5)


def submit(client, callback_url: str, model: bytes = b"\x08\x07 a model") -> dict:
    response = client.post("/optimize", files={"model": ("m.onnx", model)},
                           data={"places": "x86/fp32/nchw", "callback_url": callback_url})
    assert response.status_code == 202, response.text
    return response.json()


def test_the_end_of_a_job_is_posted_signed_to_its_callback(service, receiver):
    client, worker = service
    worker.start()
    job = submit(client, receiver.url)
    done = wait_done(client, job["id"])
    ((headers, body),) = receiver.wait(1)
    assert verify_signature(SECRET, body, headers["X-Mirserve-Signature"])
    assert not verify_signature("another secret", body, headers["X-Mirserve-Signature"])
    assert not verify_signature(SECRET, body.replace(b"succeeded", b"failed"), headers["X-Mirserve-Signature"])
    notice = json.loads(body)
    assert notice["event"] == "job.finished" and notice["delivery_attempt"] == 1
    assert notice["job"]["id"] == job["id"] and notice["job"]["status"] == "succeeded"
    assert notice["job"]["artifact"]["sha256"] == done["artifact"]["sha256"]
    state = wait_until(lambda: (s := client.get(f"/jobs/{job['id']}/callback").json())["state"] == "delivered" and s,
                       5, "the callback to be delivered")
    assert state["attempts"] == 1 and state["url"] == receiver.url and state["last_error"] is None


def test_a_refusing_receiver_is_retried_with_backoff_until_it_takes_it(service, receiver):
    client, worker = service
    receiver.statuses = [500, 503]
    worker.start()
    job = submit(client, receiver.url)
    received = receiver.wait(3)
    assert [json.loads(b)["delivery_attempt"] for _, b in received] == [1, 2, 3]
    state = wait_until(lambda: (s := client.get(f"/jobs/{job['id']}/callback").json())["state"] == "delivered" and s,
                       5, "the callback to be delivered")
    assert state["attempts"] == 3


def test_jobs_that_fail_or_are_canceled_while_queued_are_notified_too(service, receiver):
    client, worker = service
    queued = submit(client, receiver.url)  # no worker yet: cancel ends it at once, in the API
    assert client.post(f"/jobs/{queued['id']}/cancel").json()["status"] == "canceled"
    worker.start()
    ((_, body),) = receiver.wait(1)
    assert json.loads(body)["job"] == {"id": queued["id"], "status": "canceled", "input_filename": "m.onnx",
                                       "finished_at": json.loads(body)["job"]["finished_at"],
                                       "links": {"self": f"/jobs/{queued['id']}"}}


def test_a_slow_receiver_holds_up_no_job(service, receiver):
    client, worker = service
    receiver.answering.clear()  # the receiver takes every notice and answers none until the test lets it
    worker.start()
    first = submit(client, receiver.url, b"\x08\x07 first")
    wait_done(client, first["id"])
    assert len(receiver.wait(1, what="arrived")) == 1  # the first notice is in the receiver, unanswered
    second = submit(client, receiver.url, b"\x08\x07 second")
    assert wait_done(client, second["id"])["status"] == "succeeded"
    assert receiver.received == []  # the second job ended while the first notice was still being received
    receiver.answering.set()
    assert len(receiver.wait(2, timeout=15)) == 2


@pytest.mark.parametrize("url, message", [
    ("ftp://127.0.0.1/x", "is not an http(s) URL"),
    ("http://user:pw@127.0.0.1/x", "must not carry credentials"),
    ("http://10.0.0.1/hook", "host '10.0.0.1' is not one this service calls back (MIRSERVE_CALLBACK_ALLOW: "
                             "127.0.0.1)"),
])
def test_only_allowed_hosts_are_called_back(service, url, message):
    client, _ = service
    response = client.post("/optimize", files={"model": ("m.onnx", b"\x08\x07")},
                           data={"places": "x86/fp32/nchw", "callback_url": url})
    assert response.status_code == 422 and response.json()["field"] == "callback_url"
    assert message in response.json()["detail"] and response.json()["type"] == "/problems/callback-refused"
    assert client.get("/jobs").json()["total"] == 0


def test_the_allow_list_matches_host_or_host_and_port():
    assert check_callback_url("https://hooks.example:8443/x", ["hooks.example:8443"])
    assert check_callback_url("https://hooks.example/x", ["HOOKS.example"])
    with pytest.raises(CallbackRefused, match="calls back no host"):
        check_callback_url("https://hooks.example/x", [])
    with pytest.raises(CallbackRefused, match="not one this service calls back"):
        check_callback_url("https://hooks.example:9/x", ["hooks.example:8443"])


def test_signatures_expire():
    body = b'{"event": "job.finished"}'
    assert verify_signature(SECRET, body, sign(SECRET, body))
    assert not verify_signature(SECRET, body, sign(SECRET, body, timestamp=int(time.time()) - 3600))
    assert not verify_signature(SECRET, body, "garbage")


def test_callbacks_need_a_secret():
    from pydantic import ValidationError

    from worker.jobs.config import JobSettings

    with pytest.raises(ValidationError, match="MIRSERVE_CALLBACK_SECRET must be set"):
        JobSettings(callback_allow="hooks.example")
