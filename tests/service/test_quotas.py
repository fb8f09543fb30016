"""Quotas and rate limits per owner (issue 14): unfinished jobs, stored bytes, submissions per minute. Each
refusal is a 429 problem naming the limit, with Retry-After, decided before the upload is kept; admins have
none. In process, on a real SQLite job table, with MIRSERVE_AUTH=keys."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.quotas import QuotaExceeded, UploadRate
from app.settings import Settings
from tests.service.conftest import FAKE_ENGINE, upgraded_database
from tests.service.test_api import MODEL, assert_problem, leftovers, post_model
from worker.jobs import JobStore, KeyStore


@pytest.fixture
def make_client(tmp_path):
    made = []

    def make(**quotas):
        settings = Settings(data_dir=tmp_path / "data", engine=FAKE_ENGINE, job_memory_mb=1024, auth="keys",
                            **quotas)
        upgraded_database(settings.effective_database_url)
        store = JobStore(settings.effective_database_url)
        keys = KeyStore(store)
        tokens = {name: {"Authorization": f"Bearer {keys.create(name, role)[1]}"}
                  for name, role in (("alice", "user"), ("bob", "user"), ("root", "admin"))}
        store.dispose()
        client = TestClient(create_app(settings)).__enter__()
        made.append(client)
        return client, tokens, settings

    yield make
    for client in made:
        client.__exit__(None, None, None)


def refused(response, limit: str) -> dict:
    body = assert_problem(response, 429)
    assert body["type"] == "/problems/quota-exceeded" and body["limit"] == limit, body
    assert int(response.headers["retry-after"]) >= 1
    return body


def test_unfinished_jobs_per_owner_are_limited_and_a_finished_one_frees_a_place(make_client):
    client, tokens, _ = make_client(quota_active_jobs=2, quota_uploads_per_minute=0)
    first = post_model(client, headers=tokens["alice"]).json()["id"]
    assert post_model(client, headers=tokens["alice"]).status_code == 202
    body = refused(post_model(client, headers=tokens["alice"]), "active_jobs")
    assert (body["maximum"], body["current"]) == (2, 2) and "queued or running" in body["detail"]
    assert post_model(client, headers=tokens["bob"]).status_code == 202  # each owner has its own
    assert post_model(client, headers=tokens["root"]).status_code == 202  # admins have none
    assert client.post(f"/jobs/{first}/cancel", headers=tokens["alice"]).json()["status"] == "canceled"
    assert post_model(client, headers=tokens["alice"]).status_code == 202


def test_stored_bytes_per_owner_are_limited_counting_the_upload_and_nothing_is_kept(make_client):
    client, tokens, settings = make_client(quota_stored_mb=2.5 * len(MODEL) / (1 << 20), quota_uploads_per_minute=0,
                                           quota_active_jobs=0)
    jobs = [post_model(client, headers=tokens["alice"]).json()["id"] for _ in range(2)]
    kept = sorted(leftovers(settings))
    body = refused(post_model(client, headers=tokens["alice"]), "stored_bytes")  # 3 uploads would not fit
    assert body["current"] == 3 * len(MODEL) and "delete jobs" in body["detail"]
    assert sorted(leftovers(settings)) == kept  # the refused upload left nothing
    assert client.delete(f"/jobs/{jobs[0]}", headers=tokens["alice"]).status_code == 204
    assert post_model(client, headers=tokens["alice"]).status_code == 202


def test_submissions_per_minute_are_limited_before_the_body_is_read(make_client):
    client, tokens, settings = make_client(quota_uploads_per_minute=3, quota_active_jobs=0)
    for _ in range(3):
        assert post_model(client, headers=tokens["alice"]).status_code == 202
    body = refused(client.post("/optimize", headers={**tokens["alice"], "content-type": "text/plain"},
                               content=b"not even a form"), "uploads_per_minute")
    assert body["maximum"] == 3 and 1 <= int(body["detail"].split("in ")[-1].split(" s")[0]) <= 60
    assert post_model(client, headers=tokens["bob"]).status_code == 202
    assert post_model(client, headers=tokens["root"]).status_code == 202
    assert len([p for p in leftovers(settings) if p.count("/") == 0]) == 5  # five jobs' directories, no more


def test_the_upload_rate_slides_over_the_last_minute():
    now = [1000.0]
    rate = UploadRate(2, clock=lambda: now[0])
    rate.admit("a")
    now[0] += 30
    rate.admit("a")
    with pytest.raises(QuotaExceeded) as full:
        rate.admit("a")
    assert full.value.retry_after == 30 and full.value.extensions["limit"] == "uploads_per_minute"
    rate.admit("b")
    now[0] += 30.001  # the first submission left the window
    rate.admit("a")
    with pytest.raises(QuotaExceeded):
        rate.admit("a")
    UploadRate(0).admit("a")  # 0: no limit
