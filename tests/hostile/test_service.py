"""Every hostile model through a running ``mirserve serve``: each job fails with a clear error or succeeds
verified; no byte of a planted secret outside the job directory and no server path in any response; every
job ends within its budget. All cases go to one server, submitted at once."""
from __future__ import annotations

import json
import sys

import pytest

from tests.hostile.conftest import SLOW, assert_clean_refusal
from tests.hostile.corpus import VERIFIED
from tests.service.server import REPO, Server

#: The job's time limit; verification gets a sixth of it (worker.jobs.engine.VERIFY_TIME_SHARE).
JOB_SECONDS = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory, corpus):
    data = tmp_path_factory.mktemp("hostile-serve") / "data"
    data.mkdir()
    (data / "secret.bin").write_bytes(corpus.secret)  # beside the job table, as an operator's files would be
    with Server(data, max_upload_mb=16, job_time_limit_seconds=JOB_SECONDS) as running:
        yield running


def server_paths(server) -> list[str]:
    return [str(server.data_dir.resolve()), str(server.data_dir), str(REPO), sys.prefix,
            str(server.data_dir.resolve().parent)]


def run_cases(server, corpus, cases) -> None:
    submitted = {}
    for case in cases:
        response = server.submit(case.path(corpus.models), "x86/fp32/nchw", filename=f"{case.name}.onnx")
        if response.status_code == 422:  # refused at the door (an empty file): a problem document that says why
            assert response.headers["content-type"] == "application/problem+json"
            assert_clean_refusal(case, response.json()["detail"])
            continue
        assert response.status_code == 202, response.text
        submitted[case.name] = (case, response.json()["id"])
    secret, paths = corpus.secret.decode(), server_paths(server)
    failures = []
    for case, job_id in submitted.values():
        job = server.wait_for(job_id, timeout=JOB_SECONDS * 2 + 60 * len(submitted) / 10)
        try:
            check_job(server, corpus, case, job, secret, paths)
        except AssertionError as failure:
            failures.append(f"{case.name}: {failure}")
    assert not failures, "\n".join(failures)


def check_job(server, corpus, case, job, secret: str, paths: list[str]) -> None:
    job_id = job["id"]
    texts = [json.dumps(job)]
    if job["status"] == "failed":
        assert job["error"]["type"] not in ("InternalError", "ResourceLimitError"), (case.name, job["error"])
        assert_clean_refusal(case, job["error"]["message"])
        assert server.client.get(f"/jobs/{job_id}/artifact").status_code == 409
    else:
        assert job["status"] == "succeeded", (case.name, job)
        assert case.expect == VERIFIED, f"{case.name} should have been refused: {job['summary']}"
        assert job["summary"]["verified"] is True, (case.name, job["summary"])
        artifact = server.client.get(f"/jobs/{job_id}/artifact")
        assert artifact.status_code == 200 and corpus.secret not in artifact.content
        for route in ("report", "trace"):
            response = server.client.get(f"/jobs/{job_id}/{route}")
            assert response.status_code == 200, (case.name, route, response.text)
            texts.append(response.text)
    started, finished = job.get("started_at"), job.get("finished_at")
    if started and finished:
        from datetime import datetime

        took = (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()
        assert took < JOB_SECONDS, f"{case.name} took {took:.0f} s"
    for text in texts:
        assert secret not in text, case.name
        for path in paths:
            assert path not in text, f"{case.name}: a server path ({path}) in {text[:300]}"


def test_every_quick_case_is_refused_clearly_or_verified_by_the_service(server, corpus):
    run_cases(server, corpus, [c for c in corpus.cases if c.expect != VERIFIED and c.name not in SLOW])


@pytest.mark.models
def test_every_case_that_runs_the_model_is_refused_clearly_or_verified_by_the_service(server, corpus):
    run_cases(server, corpus, [c for c in corpus.cases if c.expect == VERIFIED or c.name in SLOW])


def test_a_place_list_over_2000_characters_is_422(server, corpus):
    response = server.submit(corpus.models / "name_empty_everything.onnx", ",".join(["x86/fp32/nchw"] * 200))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "places" and "at most 2000 characters" in response.json()["detail"]


def test_limits_are_not_an_option_a_client_can_set(server, corpus):
    response = server.submit(corpus.models / "name_empty_everything.onnx", "x86/fp32/nchw",
                             {"limits": {"max_tensor_mb": 1 << 20}})
    assert response.status_code == 422 and "unknown option 'limits'" in response.json()["detail"]


def test_an_unverifiable_model_succeeds_only_when_asked_and_then_says_unverified(server, corpus):
    model = corpus.models / "name_duplicate_nodes.onnx"
    refused = server.wait_for(server.submit(model, "x86/fp32/nchw").json()["id"])
    assert refused["status"] == "failed" and "cannot be verified" in refused["error"]["message"]
    allowed = server.wait_for(server.submit(model, "x86/fp32/nchw", {"allow_unverified": True}).json()["id"])
    assert allowed["status"] == "succeeded" and allowed["summary"]["verified"] is False
    assert any(w.startswith("not verified: onnxruntime cannot run the input model")
               for w in allowed["summary"]["warnings"]), allowed["summary"]
