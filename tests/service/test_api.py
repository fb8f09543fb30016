"""The HTTP API in process (TestClient), on a real SQLite job table and SqliteHuey queue in a temporary
directory; jobs are run, where a test needs them run, by an embedded worker with the scripted engine.
"""
from __future__ import annotations

import hashlib
import os
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.openapi import render
from app.settings import Settings
from tests.service.conftest import FAKE_ENGINE, upgraded_database
from tests.waiting import wait_until
from worker.jobs.consumer import JobWorker

REPO = Path(__file__).resolve().parents[2]
MODEL = b"\x08\x07" + b"pretend this is an ONNX model" * 10


@pytest.fixture
def settings(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", max_upload_mb=0.5, engine=FAKE_ENGINE, lease_seconds=3,
                        heartbeat_seconds=0.3, reaper_interval_seconds=0.5, job_memory_mb=1024)
    upgraded_database(settings.effective_database_url)
    return settings


@pytest.fixture
def client(settings):
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def worker(settings, client):
    job_worker = JobWorker(settings)
    job_worker.start()
    yield job_worker
    job_worker.stop(timeout=5)


def post_model(client, model=MODEL, places="arm/fp16/nhwc,arm/fp32/nchw", options=None, headers=None,
               filename="det.onnx"):
    data = {"places": places} if places is not None else {}
    if options is not None:
        data["options"] = options if isinstance(options, str) else json.dumps(options)
    return client.post("/optimize", files={"model": (filename, model)}, data=data, headers=headers or {})


def assert_problem(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["title"] and body["type"]
    if field is not None:
        assert body.get("field") == field, body
    return body


def wait_done(client, job_id: str, timeout: float = 20) -> dict:
    finished = ("succeeded", "failed", "canceled")
    return wait_until(lambda: (job := client.get(f"/jobs/{job_id}").json())["status"] in finished and job, timeout,
                      f"job {job_id} to finish")


def leftovers(settings) -> list[str]:
    """Whatever the store holds of jobs: written, partly written, or directories."""
    jobs = settings.data_dir / "jobs"
    return [str(p.relative_to(jobs)) for p in jobs.rglob("*")] if jobs.exists() else []


def test_submit_answers_202_with_location_retry_after_and_the_queued_job(client):
    response = post_model(client, options={"input_shapes": {"x": [1, 3, 64, 64]}})
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/jobs/{job['id']}" and int(response.headers["retry-after"]) > 0
    assert job["status"] == "queued" and job["places"] == "arm/fp16/nhwc,arm/fp32/nchw"
    assert job["options"]["input_shapes"] == {"x": [1, 3, 64, 64]} and job["options"]["opt_level"] == 2
    assert job["input"] == {"filename": "det.onnx", "bytes": len(MODEL), "sha256": hashlib.sha256(MODEL).hexdigest()}
    assert client.get(response.headers["location"]).json()["id"] == job["id"]


def test_a_job_runs_to_succeeded_and_its_artifact_has_a_strong_etag(client, worker):
    job = wait_done(client, post_model(client).json()["id"])
    assert job["status"] == "succeeded" and job["progress"] == {"current_pass": "fake_pass_3", "index": 3, "total": 3}
    assert job["summary"]["passes_run"] == 3 and job["artifact"]["sha256"] == hashlib.sha256(MODEL).hexdigest()
    artifact = client.get(job["links"]["artifact"])
    assert artifact.status_code == 200 and artifact.content == MODEL
    etag = artifact.headers["etag"]
    assert etag == f'"{job["artifact"]["sha256"]}"' and not etag.startswith("W/")
    assert 'filename="det.opt.onnx"' in artifact.headers["content-disposition"]
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        cached = client.get(job["links"]["artifact"], headers={"If-None-Match": header})
        assert cached.status_code == 304 and cached.content == b"" and cached.headers["etag"] == etag
    assert client.get(job["links"]["artifact"], headers={"If-None-Match": '"other"'}).status_code == 200


def test_trace_memory_and_report_come_from_the_published_report(client, worker):
    job = wait_done(client, post_model(client).json()["id"])
    trace = client.get(job["links"]["trace"]).json()
    assert [t["pass"] for t in trace] == ["fake_pass_1", "fake_pass_2", "fake_pass_3"]
    assert client.get(job["links"]["memory"]).json()["arenas"] == [{"space": "host", "arena_bytes": 1024}]
    assert (job["summary"]["arena_bytes"], job["summary"]["weights_bytes"], job["summary"]["macs"]) == (1024, 10, 99)
    report = client.get(job["links"]["report"]).json()
    assert report["trace"] == trace and report["verification"]["passed"] is True


def test_a_report_without_memory_estimates_answers_memory_with_404(client, settings):
    job = post_model(client).json()
    job_worker = JobWorker(settings)
    _script(job_worker, job["id"], {"no_memory": True})
    job_worker.start()
    try:
        assert wait_done(client, job["id"])["status"] == "succeeded"
    finally:
        job_worker.stop(timeout=5)
    body = assert_problem(client.get(job["links"]["memory"]), 404)
    assert "no memory estimates" in body["detail"]
    assert client.get(job["links"]["trace"]).status_code == 200


def test_memory_at_other_sizes_of_the_open_dims_comes_from_the_formulas(client, settings):
    job, static = post_model(client).json(), post_model(client).json()
    job_worker = JobWorker(settings)
    _script(job_worker, job["id"], {"open_dims": True})
    job_worker.start()
    try:
        assert wait_done(client, job["id"])["status"] == wait_done(client, static["id"])["status"] == "succeeded"
    finally:
        job_worker.stop(timeout=5)
    at = client.get(job["links"]["memory"], params={"dims": "batch=8"}).json()
    assert at["arenas"] == [{"space": "host", "arena_bytes": 8192, "arena_formula": "1024*batch",
                             "peak_bytes": 8192, "peak_formula": "1024*batch"}]
    assert at["io_bytes"] == 128 and at["extrapolated"] == ["batch"] and at["dims"] == {"batch": 8}
    body = assert_problem(client.get(job["links"]["memory"], params={"dims": "seq=8"}), 422, "dims")
    assert "the model's open dims are batch" in body["detail"]
    body = assert_problem(client.get(static["links"]["memory"], params={"dims": "batch=8"}), 422, "dims")
    assert "no open dims" in body["detail"]


def test_a_model_over_2_gb_serves_its_external_weights_too(client, settings):
    plain, big = post_model(client).json(), post_model(client).json()
    job_worker = JobWorker(settings)
    _script(job_worker, big["id"], {"external_data": True})  # before any worker runs: no race
    job_worker.start()
    try:
        plain, big = wait_done(client, plain["id"]), wait_done(client, big["id"])
    finally:
        job_worker.stop(timeout=5)
    assert plain["artifact"]["data_url"] is None and plain["summary"]["external_data"] is False
    assert_problem(client.get(plain["links"]["artifact"] + "/data"), 404)
    assert big["summary"]["external_data"] is True
    data = client.get(big["artifact"]["data_url"])
    assert data.status_code == 200 and data.content == b"weights" * 100
    assert 'filename="model.onnx.data"' in data.headers["content-disposition"]


def _script(job_worker: JobWorker, job_id: str, options: dict) -> None:
    """Replace a queued job's stored options: the scripted engine reads its script from them."""
    from worker.jobs.db import write_transaction
    from worker.jobs.store import jobs_table

    with write_transaction(job_worker.store.engine) as conn:
        conn.execute(jobs_table.update().where(jobs_table.c.id == job_id)
                     .values(spec={"places": "x86/fp32/nchw", "options": options}))


def test_results_of_an_unfinished_job_are_409(client):
    job = post_model(client).json()
    for link in ("artifact", "trace", "memory", "report"):
        body = assert_problem(client.get(job["links"][link]), 409)
        assert body["job_status"] == "queued" and "once it has succeeded" in body["detail"]


@pytest.mark.parametrize("places, options, field, words", [
    ("arm/fp16/nhwc,tpu/fp32/nchw", None, "places", "'tpu'"),
    ("arm/fp8/nhwc", None, "places", "'fp8'"),
    ("x86", "{not json", "options", "not valid JSON"),
    ("x86", "[1, 2]", "options", "JSON object"),
    ("x86", {"opt_level": 9}, "options.opt_level", "from 0 to 2"),
    ("x86", {"optimise": True}, "options.optimise", "unknown option"),
    ("x86", {"disabled_passes": ["no_such_pass"]}, "options.disabled_passes", "'no_such_pass'"),
    ("x86", {"pipeline": "nope"}, "options.pipeline", "unknown pipeline"),
    ("x86", {"trusted_external_data": True}, "options.trusted_external_data", "unknown option"),
    ("x86", {"places": "arm"}, "options.places", "'places' form field"),
    ("x86", {"input_shapes": {"x": [1, -3]}}, "options.input_shapes", "non-negative"),
])
def test_bad_places_and_options_are_422_naming_the_field_and_nothing_is_kept(client, settings, places, options,
                                                                             field, words):
    body = assert_problem(post_model(client, places=places, options=options), 422, field)
    assert words in body["detail"]
    assert leftovers(settings) == []
    assert client.get("/jobs").json()["total"] == 0


def test_an_upload_over_the_cap_is_413_and_leaves_no_file(client, settings):
    body = assert_problem(post_model(client, model=b"\0" * (1 << 20)), 413, "model")
    assert "0.5 MiB" in body["detail"]
    assert leftovers(settings) == [] and client.get("/jobs").json()["total"] == 0


def test_a_body_that_is_not_a_form_is_415(client):
    assert_problem(client.post("/optimize", json={"model": "x"}), 415)


@pytest.mark.parametrize("method, suffix", [("get", ""), ("get", "/artifact"), ("get", "/trace"),
                                            ("post", "/cancel"), ("delete", "")])
def test_an_unknown_job_is_404(client, method, suffix):
    body = assert_problem(getattr(client, method)(f"/jobs/3f1e0c9a-0000-4000-8000-000000000000{suffix}"), 404,
                          "job_id")
    assert "no job" in body["detail"]


def test_unknown_paths_and_methods_are_problems_too(client):
    assert_problem(client.get("/nowhere"), 404)
    body = assert_problem(client.put("/jobs"), 405)
    assert "PUT" in body["detail"]
    assert client.put("/jobs").headers["allow"] == "GET"


def test_jobs_are_listed_newest_first_with_pagination_and_a_status_filter(client):
    ids = [post_model(client).json()["id"] for _ in range(3)]
    client.post(f"/jobs/{ids[0]}/cancel")
    page = client.get("/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["items"]] == [ids[2], ids[1]] and page["total"] == 3 and page["next_offset"] == 2
    last = client.get("/jobs", params={"limit": 2, "offset": 2}).json()
    assert [j["id"] for j in last["items"]] == [ids[0]] and last["next_offset"] is None
    canceled = client.get("/jobs", params={"status": "canceled"}).json()
    assert [j["id"] for j in canceled["items"]] == [ids[0]]
    assert_problem(client.get("/jobs", params={"status": "lost"}), 422, "query.status")
    assert_problem(client.get("/jobs", params={"limit": 0}), 422, "query.limit")


def test_cancel_a_queued_job_then_cancel_again_is_409(client):
    job = post_model(client).json()
    response = client.post(f"/jobs/{job['id']}/cancel")
    assert response.status_code == 202 and response.json()["status"] == "canceled"
    assert_problem(client.post(f"/jobs/{job['id']}/cancel"), 409)


def test_delete_removes_the_job_and_its_files(client, settings):
    job = post_model(client).json()
    assert (settings.data_dir / "jobs" / job["id"] / "input.onnx").is_file()
    assert client.delete(f"/jobs/{job['id']}").status_code == 204
    assert not (settings.data_dir / "jobs" / job["id"]).exists()
    assert_problem(client.get(f"/jobs/{job['id']}"), 404)


def test_a_running_job_cannot_be_deleted_but_can_be_canceled(client, settings):
    job = post_model(client).json()
    job_worker = JobWorker(settings)
    _script(job_worker, job["id"], {"passes": 1, "pass_seconds": 30})
    job_worker.start()
    try:
        wait_until(lambda: client.get(f"/jobs/{job['id']}").json()["progress"], 10, "the job's first pass")
        assert client.get(f"/jobs/{job['id']}").json()["status"] == "running"
        assert_problem(client.delete(f"/jobs/{job['id']}"), 409)
        assert client.post(f"/jobs/{job['id']}/cancel").json()["cancel_requested"] is True
        assert wait_done(client, job["id"])["status"] == "canceled"
    finally:
        job_worker.stop(timeout=5)


def test_an_idempotency_key_replays_the_same_job_and_refuses_a_different_request(client):
    first = post_model(client, headers={"Idempotency-Key": "upload-42"})
    again = post_model(client, headers={"Idempotency-Key": "upload-42"})
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
    assert client.get("/jobs").json()["total"] == 1
    body = assert_problem(post_model(client, places="x86", headers={"Idempotency-Key": "upload-42"}), 422,
                          "Idempotency-Key")
    assert body["job_id"] == first.json()["id"]
    assert client.get("/jobs").json()["total"] == 1


def test_readiness_needs_a_worker_heartbeat(client, settings):
    body = assert_problem(client.get("/readyz"), 503)
    assert body["checks"]["database"]["ok"] and body["checks"]["queue"]["ok"] and body["checks"]["storage"]["ok"]
    assert not body["checks"]["worker"]["ok"]
    job_worker = JobWorker(settings)
    job_worker.start()
    try:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
    finally:
        job_worker.stop(timeout=5)


def test_liveness_answers_without_dependencies(client):
    response = client.get("/healthz")
    assert response.json()["status"] == "ok"
    name, duration = response.headers["server-timing"].split(";dur=")
    assert name == "app" and 0 < float(duration) < 10_000


def test_metrics_are_prometheus_text_with_jobs_requests_and_latency(client):
    post_model(client)
    client.get("/jobs/unknown")
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = response.text.splitlines()
    assert 'mirserve_jobs{status="queued"} 1' in lines
    assert 'mirserve_http_requests_total{method="GET",route="/jobs/{job_id}",status="404"} 1' in lines
    assert 'mirserve_http_requests_total{method="POST",route="/optimize",status="202"} 1' in lines
    assert any(line.startswith('mirserve_http_request_duration_seconds_bucket{route="/optimize",le="+Inf"} 1')
               for line in lines)
    assert "mirserve_queue_messages 1" in lines and "mirserve_workers 0" in lines
    for line in lines:  # every sample line is "name{labels} number"
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])


def test_passes_and_targets_come_from_the_engine(client):
    from worker.engine.api import list_passes, list_targets

    assert [p["name"] for p in client.get("/passes").json()["passes"]] == [p["name"] for p in list_passes()]
    expected = {t["name"]: t for t in list_targets()}
    targets = {t["name"]: t for t in client.get("/targets").json()}
    assert targets.keys() == expected.keys() and {"host", "x86", "arm"} <= targets.keys()
    for name, target in targets.items():
        assert target["kernel_count"] == len(expected[name]["kernels"]) == len(target["kernels"])
        assert [k["id"] for k in target["kernels"]] == [k["id"] for k in expected[name]["kernels"]]
    brief = {t["name"]: t for t in client.get("/targets", params={"kernels": "false"}).json()}
    assert brief["x86"]["kernels"] is None and brief["x86"]["kernel_count"] == targets["x86"]["kernel_count"] > 0


def test_targets_filter_by_op(client):
    conv = {t["name"]: t for t in client.get("/targets", params={"op": "Conv"}).json()}
    assert {"host", "x86", "arm", "npu"} <= conv.keys()
    assert all(k["op"] == "Conv" for t in conv.values() for k in t["kernels"])
    assert all(t["kernel_count"] == len(t["kernels"]) > 0 for t in conv.values())
    assert "arm:Conv:1-21:fp16:nhwc" in {k["id"] for k in conv["arm"]["kernels"]}
    fused = {t["name"] for t in client.get("/targets", params={"op": "mirserve.FusedConvHardSigmoid"}).json()}
    assert {"host", "arm"} <= fused  # ARM's kernel is derived from the body's ops (Conv, Mul, Add, Clip)
    assert client.get("/targets", params={"op": "com.example.Nothing"}).json() == []
    assert client.get("/targets", params={"op": "x" * 201}).status_code == 422


def test_a_query_parameter_given_twice_is_refused_not_half_read(client):
    # FastAPI would keep the last value: GET /targets?op=Conv&op=Relu would list Relu's kernels only.
    problem = assert_problem(client.get("/targets", params=[("op", "Conv"), ("op", "Relu")]), 422, "query.op")
    assert "given 2 times" in problem["detail"]
    assert_problem(client.get("/jobs", params=[("limit", 1), ("limit", 2), ("offset", 0)]), 422, "query.limit")
    assert client.get("/targets", params=[("op", "Conv"), ("kernels", "false")]).status_code == 200
    # The rule is only right while no query parameter of the API is a list.
    document = client.get("/openapi.json").json()
    lists = [(path, p["name"]) for path, item in document["paths"].items() for op in item.values()
             for p in op.get("parameters", []) if p["in"] == "query"
             and "array" in json.dumps(p["schema"])]
    assert not lists


def test_the_committed_openapi_document_is_what_the_app_serves(client):
    committed = (REPO / "openapi" / "openapi.json").read_text(encoding="utf-8")
    served = client.get("/openapi.json").json()
    assert json.loads(committed) == served, "openapi/openapi.json is stale: run `mirserve openapi -o openapi/openapi.json`"
    assert committed == render(client.app)


def test_every_operation_documents_its_errors_as_problems(client):
    document = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "500" in responses, f"{method} {path}"
            for status, entry in responses.items():
                if int(status) >= 400:
                    assert list(entry["content"]) == ["application/problem+json"], f"{method} {path} {status}"


def test_with_an_s3_store_a_hostile_archive_fails_its_job_naming_the_member(tmp_path, s3_bucket):
    """The API keeps no local copy of an upload to a bucket: the engine process checks the members before it
    unpacks, and the job fails with the refusal the API would have given."""
    from tests.service.archives import hostile

    settings = Settings(data_dir=tmp_path / "data", max_upload_mb=16, engine=FAKE_ENGINE, lease_seconds=3,
                        heartbeat_seconds=0.3, job_memory_mb=1024, storage_url=f"s3://{s3_bucket}/svc")
    upgraded_database(settings.effective_database_url)
    data, member = hostile(MODEL)["dot_dot"]
    with TestClient(create_app(settings)) as client:
        job_worker = JobWorker(settings)
        job_worker.start()
        try:
            job = wait_done(client, post_model(client, model=data, filename="m.tar").json()["id"])
        finally:
            job_worker.stop(timeout=5)
    assert job["status"] == "failed" and job["error"]["type"] == "ArchiveError", job
    assert job["error"]["field"] == "model" and repr(member) in job["error"]["message"]
    assert not list(tmp_path.rglob("mirserve-escape.bin"))  # the scratch (attempt dirs) included


@pytest.mark.parametrize("redirect", [False, True])
def test_with_an_s3_store_uploads_artifacts_and_reports_live_in_the_bucket(tmp_path, s3_bucket, redirect):
    import boto3
    import httpx

    settings = Settings(data_dir=tmp_path / "data", max_upload_mb=16, engine=FAKE_ENGINE, lease_seconds=3,
                        heartbeat_seconds=0.3, job_memory_mb=1024, storage_url=f"s3://{s3_bucket}/svc",
                        storage_redirect=redirect)
    upgraded_database(settings.effective_database_url)
    model = b"\x08\x07" + os.urandom(9 << 20)  # a multipart upload
    with TestClient(create_app(settings)) as client:
        job_worker = JobWorker(settings)
        job_worker.start()
        try:
            job = wait_done(client, post_model(client, model=model).json()["id"])
        finally:
            job_worker.stop(timeout=5)
        assert job["status"] == "succeeded" and job["artifact"]["sha256"] == hashlib.sha256(model).hexdigest()
        keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=s3_bucket)["Contents"])
        assert keys == [f"svc/jobs/{job['id']}/{name}" for name in
                        ("attempt-1/engine.log", "attempt-1/model.onnx", "attempt-1/report.json", "input.onnx")]
        assert not (settings.data_dir / "jobs").exists()  # nothing of the job on the API's or worker's disk
        answer = client.get(job["links"]["artifact"], follow_redirects=False)
        if redirect:
            assert answer.status_code == 307 and answer.headers["etag"] == f'"{job["artifact"]["sha256"]}"'
            answer = httpx.get(answer.headers["location"])
        assert answer.status_code == 200 and answer.content == model
        assert 'filename="det.opt.onnx"' in answer.headers["content-disposition"]
        etag = f'"{job["artifact"]["sha256"]}"'
        part = client.get(job["links"]["artifact"], headers={"Range": "bytes=5000000-", "If-Range": etag},
                          follow_redirects=False)
        if redirect:  # the store answers the Range at the presigned URL
            part = httpx.get(part.headers["location"], headers={"Range": "bytes=5000000-"})
        assert part.status_code == 206 and part.content == model[5000000:]
        archive = client.get(job["artifact"]["archive_url"], headers={"Range": "bytes=512-"})  # after the header
        assert archive.status_code == 206 and archive.content.startswith(model)
        assert client.get(job["links"]["trace"]).json()[0]["pass"] == "fake_pass_1"
        assert client.delete(f"/jobs/{job['id']}").status_code == 204
        assert boto3.client("s3").list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
