"""The synchronous client against a real HTTP service (scripted engine): jobs, typed problems, retries that
never make two jobs, downloads that are checked and resume."""
from __future__ import annotations

import hashlib

import httpx
import pytest

from app.client import (Client, Conflict, ConnectionFailed, IntegrityError, InvalidRequest, JobFailed, NotFound,
                        RetryPolicy, WaitTimeout)
from tests.client.conftest import MODEL_BYTES

FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)


class Faults(httpx.BaseTransport):
    """A real HTTP transport with scripted faults: ``before`` fails requests before they are sent, ``after``
    sends them and loses the answer (the server did the work), ``cut`` breaks a download after N bytes, and
    ``answer`` replaces the answer with a status (e.g. 503 with Retry-After)."""

    def __init__(self):
        self.real = httpx.HTTPTransport()
        self.before: list[str] = []   # "METHOD path" of requests to fail once each, before sending
        self.after: list[str] = []    # ... to send, then lose the answer
        self.answer: dict[str, list[int]] = {}
        self.cut: dict[str, int] = {}  # path -> bytes after which the body breaks (once)
        self.corrupt: list[str] = []   # paths whose next body gets one byte flipped (once per entry)
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = f"{request.method} {request.url.path}"
        if key in self.before:
            self.before.remove(key)
            raise httpx.ConnectError("scripted: connection refused", request=request)
        if self.answer.get(key):
            status = self.answer[key].pop(0)
            return httpx.Response(status, headers={"Retry-After": "0", "content-type": "application/problem+json"},
                                  json={"type": "/problems/overloaded", "title": "Overloaded", "status": status},
                                  request=request)
        self.sent.append(request)
        response = self.real.handle_request(request)
        if key in self.after:
            self.after.remove(key)
            response.read()
            raise httpx.ReadError("scripted: connection reset", request=request)
        if request.url.path in self.corrupt:
            self.corrupt.remove(request.url.path)
            body = bytearray(response.read())
            body[len(body) // 2] ^= 0xFF
            return httpx.Response(response.status_code, headers=response.headers, content=bytes(body),
                                  request=request)
        if request.url.path in self.cut:
            limit = self.cut.pop(request.url.path)
            return httpx.Response(response.status_code, headers=response.headers,
                                  stream=_Broken(response, limit), request=request)
        return response

    def close(self) -> None:
        self.real.close()


class _Broken(httpx.SyncByteStream):
    def __init__(self, response: httpx.Response, limit: int):
        self.response, self.limit = response, limit

    def __iter__(self):
        sent = 0
        for chunk in self.response.iter_raw(4096):
            if sent + len(chunk) > self.limit:
                yield chunk[:self.limit - sent]
                raise httpx.ReadError("scripted: connection reset mid-body")
            sent += len(chunk)
            yield chunk

    def close(self) -> None:
        self.response.close()


@pytest.fixture
def faults():
    return Faults()


@pytest.fixture
def client(service, faults):
    with Client(service.url, retry=FAST, transport=faults) as made:
        yield made


def count_jobs(client) -> int:
    return client.list_jobs(limit=1)["total"]


def test_a_job_is_submitted_waited_for_and_downloaded(client, model_file, tmp_path):
    seen = []
    job = client.submit(model_file, "arm/fp16/nhwc,arm/fp32/nchw", input_shapes={"x": [1, 3, 8, 8]}, opt_level=1)
    assert job.status == "queued" and job.data["places"] == "arm/fp16/nhwc,arm/fp32/nchw"
    assert job.data["options"]["input_shapes"] == {"x": [1, 3, 8, 8]} and job.data["options"]["opt_level"] == 1
    assert job.wait(progress=lambda j: seen.append(j.status), poll_interval=0.05) is job
    assert job.status == "succeeded" and seen[-1] == "succeeded"
    out = job.download(tmp_path / "out.onnx")
    assert out.read_bytes() == MODEL_BYTES and not (tmp_path / "out.onnx.part").exists()
    assert job.summary["passes_run"] == 3 and [t["pass"] for t in job.trace()][0] == "fake_pass_1"
    assert job.report()["verification"]["passed"] is True and job.memory()["arenas"][0]["space"] == "host"
    assert client.job(job.id).data == job.data


def test_a_lost_answer_to_a_submission_is_retried_into_the_same_job(client, faults, model_file):
    before = count_jobs(client)
    faults.after.append("POST /optimize")  # the service makes the job; the client never hears of it
    job = client.submit(model_file, "x86/fp32/nchw")
    keys = {r.headers["idempotency-key"] for r in faults.sent if r.url.path == "/optimize"}
    assert len([r for r in faults.sent if r.url.path == "/optimize"]) == 2 and len(keys) == 1
    assert count_jobs(client) == before + 1
    assert job.wait(poll_interval=0.05).status == "succeeded"


def test_connection_errors_and_503_are_retried_with_backoff(client, faults, model_file):
    faults.before += ["POST /optimize", "POST /optimize"]
    faults.answer["POST /optimize"] = [503]
    job = client.submit(model_file)
    assert job.status in ("queued", "running", "succeeded")
    faults.answer["GET /healthz"] = [503, 502]
    assert client.health()["status"] == "ok"


def test_a_service_that_stays_unreachable_is_one_clear_error(tmp_path):
    from tests.service.server import free_port

    with Client(f"127.0.0.1:{free_port()}", retry=FAST) as nowhere:  # no scheme: http is assumed
        with pytest.raises(ConnectionFailed, match=r"^cannot reach http://127\.0\.0\.1:\d+: ConnectError"):
            nowhere.health()


def test_problems_are_typed_errors_carrying_the_problem_fields(client, model_file):
    with pytest.raises(InvalidRequest) as bad:
        client.submit(model_file, "arm/fp16/nhwc,tpu/fp32/nchw")
    error = bad.value
    assert error.status == 422 and error.field == "places" and error.slug == "invalid-option"
    assert error.type == "/problems/invalid-option" and error.title == "Invalid option"
    assert "bad target 'tpu'" in error.detail and str(error).startswith("bad target 'tpu'")
    with pytest.raises(InvalidRequest) as unknown:
        client.submit(model_file, opt_level=7)
    assert unknown.value.field == "options.opt_level"
    with pytest.raises(NotFound) as missing:
        client.job("no-such-job")
    assert missing.value.field == "job_id" and missing.value.instance == "/jobs/no-such-job"


def test_a_failed_job_raises_with_its_error_and_can_be_waited_for_without(client, service, model_file):
    with service.scripted(client, model_file, then="fail") as job:
        with pytest.raises(JobFailed, match=r"failed: ModelError: the file is not an ONNX model \(fake engine\)"):
            job.wait(poll_interval=0.05)
        assert job.error == {"type": "ModelError", "message": "the file is not an ONNX model (fake engine)",
                             "field": "model"}
        assert job.wait(raise_on_failure=False).status == "failed"
        with pytest.raises(Conflict) as conflict:
            job.download("never.onnx")
        assert conflict.value.extensions["job_status"] == "failed"


def test_progress_is_reported_each_time_the_pass_changes(client, service, model_file):
    seen = []
    with service.scripted(client, model_file, passes=4, pass_seconds=0.3) as job:
        job.wait(progress=lambda j: seen.append((j.status, (j.progress or {}).get("current_pass"))),
                 poll_interval=0.05)
    running = [name for status, name in seen if status == "running" and name]
    assert running == sorted(set(running)) and len(running) >= 3  # each pass once, in order
    assert set(running) <= {f"fake_pass_{i}" for i in range(1, 5)} and seen[-1][0] == "succeeded"


def test_wait_gives_up_after_its_timeout_and_cancel_stops_the_job(client, service, model_file):
    with service.scripted(client, model_file, passes=50, pass_seconds=0.2) as job:
        with pytest.raises(WaitTimeout, match="is still (queued|running) after 0.3 s"):
            job.wait(timeout=0.3, poll_interval=0.05)
        assert job.cancel().data["cancel_requested"] is True
        assert job.wait(raise_on_failure=False, poll_interval=0.05).status == "canceled"
        assert client.cancel(job.id).status == "canceled"  # the 409 of a canceled job is no error here
        job.delete()
        with pytest.raises(NotFound):
            job.refresh()


def test_a_broken_download_resumes_where_it_stopped(client, faults, model_file, tmp_path):
    job = client.submit(model_file).wait(poll_interval=0.05)
    path = f"/jobs/{job.id}/artifact"
    faults.cut[path] = 50_000
    out = job.download(tmp_path / "resumed.onnx")
    assert out.read_bytes() == MODEL_BYTES
    gets = [r for r in faults.sent if r.url.path == path]
    assert "range" not in gets[0].headers and gets[1].headers["range"] == "bytes=50000-"
    assert gets[1].headers["if-range"] == f'"{job.artifact["sha256"]}"'


def test_an_interrupted_download_left_on_disk_is_continued_by_the_next_call(client, faults, model_file, tmp_path):
    job = client.submit(model_file).wait(poll_interval=0.05)
    (tmp_path / "m.onnx.part").write_bytes(MODEL_BYTES[:30_000])
    assert job.download(tmp_path / "m.onnx").read_bytes() == MODEL_BYTES
    (get,) = [r for r in faults.sent if r.url.path.endswith("/artifact")]
    assert get.headers["range"] == "bytes=30000-"


def test_a_download_whose_bytes_do_not_match_the_sha256_is_refused_and_removed(client, faults, model_file,
                                                                                tmp_path):
    job = client.submit(model_file).wait(poll_interval=0.05)
    out = tmp_path / "downloads"
    out.mkdir()
    faults.corrupt.extend([f"/jobs/{job.id}/artifact"] * FAST.attempts)  # a byte flipped on the way, every try
    with pytest.raises(IntegrityError, match=f"bad.onnx: the download's sha256 [0-9a-f]{{64}} is not the job's "
                                             f"{job.artifact['sha256']}"):
        job.download(out / "bad.onnx")
    assert list(out.iterdir()) == []


def test_an_artifact_whose_etag_is_not_the_announced_one_is_refused(client, model_file, tmp_path):
    job = client.submit(model_file).wait(poll_interval=0.05)
    job.data["artifact"]["sha256"] = hashlib.sha256(b"something else").hexdigest()
    out = tmp_path / "downloads"
    out.mkdir()
    with pytest.raises(IntegrityError, match="the server's ETag .* is not the job's"):
        job.download(out / "bad.onnx")
    assert list(out.iterdir()) == []


def test_a_stale_partial_file_of_another_model_is_replaced(client, model_file, tmp_path):
    job = client.submit(model_file).wait(poll_interval=0.05)
    (tmp_path / "m.onnx.part").write_bytes(b"x" * 1000)  # not a prefix of this artifact
    assert job.download(tmp_path / "m.onnx").read_bytes() == MODEL_BYTES


def test_a_model_over_2_gb_comes_with_its_weights_file(client, service, model_file, tmp_path):
    with service.scripted(client, model_file, external_data=True) as job:
        job.wait(poll_interval=0.05)
    assert job.artifact["data_url"]
    job.download(tmp_path / "big.onnx")
    assert (tmp_path / "model.onnx.data").read_bytes() == b"weights" * 100


def test_a_model_with_external_data_downloads_as_one_archive_resumed_after_a_break(client, faults, service,
                                                                                   model_file, tmp_path):
    import tarfile

    with service.scripted(client, model_file, external_data=True) as job:
        job.wait(poll_interval=0.05)
    path = f"/jobs/{job.id}/artifact/archive"
    faults.cut[path] = 70_000  # inside the model member
    out = job.download(tmp_path / "big.tar", archive=True)
    gets = [r for r in faults.sent if r.url.path == path]
    assert gets[1].headers["range"] == "bytes=70000-" and gets[1].headers["if-range"] == f'"{job.artifact["sha256"]}.tar"'
    with tarfile.open(out) as unpacked:
        found = {m.name: unpacked.extractfile(m).read() for m in unpacked.getmembers()}
    assert found == {f"{model_file.stem}.opt.onnx": MODEL_BYTES, "model.onnx.data": b"weights" * 100}


def test_jobs_are_listed_newest_first_and_paged(client, model_file):
    made = [client.submit(model_file).id for _ in range(3)]
    page = client.list_jobs(limit=2)
    assert [j.id for j in page["items"]] == made[::-1][:2] and page["next_offset"] == 2
    listed = [j.id for j in client.iter_jobs(page_size=2)]
    assert listed[:3] == made[::-1] and len(listed) == page["total"]
    assert all(j.status == "succeeded" for j in client.list_jobs("succeeded", limit=100)["items"])


def test_the_catalogue_and_health(client):
    assert {p["name"] for p in client.passes()["passes"]} >= {"type_inference", "cut_subgraph"}
    targets = {t["name"]: t for t in client.targets(kernels=False)}
    assert targets["x86"]["kernels"] is None and targets["x86"]["kernel_count"] > 100
    assert client.ready()["status"] == "ready"


def test_the_token_goes_in_a_bearer_header(service, faults, monkeypatch):
    monkeypatch.setenv("MIRSERVE_TOKEN", "from-the-environment")
    with Client(service.url, transport=faults) as from_env:
        from_env.health()
    with Client(service.url, token="given", transport=faults) as given:
        given.health()
    assert [r.headers.get("authorization") for r in faults.sent] == ["Bearer from-the-environment", "Bearer given"]


def test_the_server_defaults_to_mirserve_server(service, monkeypatch):
    monkeypatch.setenv("MIRSERVE_SERVER", service.url)
    with Client() as client:
        assert client.server == service.url and client.health()["status"] == "ok"
