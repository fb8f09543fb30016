"""The result cache through the API in process, on the data directory and on moto's S3 server: a second
identical submission is a succeeded job at once that ran no attempt and points at its source; anything that
changes the result (model, places, options, the engine's identity) misses; ``cache=false`` and
``MIRSERVE_CACHE=0`` turn it off; deleting the source leaves the cached job whole.
"""
from __future__ import annotations

import hashlib
import time

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.service.conftest import FAKE_ENGINE, upgraded_database
from tests.service.test_api import MODEL, assert_problem, post_model, wait_done
from worker.jobs import JobSpec, JobStore
from worker.jobs.consumer import JobWorker
from worker.jobs.result_cache import cache_key, engine_identity


def make_settings(tmp_path, storage: str | None, **overrides) -> Settings:
    values = dict(data_dir=tmp_path / "data", max_upload_mb=0.5, engine=FAKE_ENGINE, lease_seconds=3,
                  heartbeat_seconds=0.3, reaper_interval_seconds=0.5, job_memory_mb=1024, storage_url=storage)
    values.update(overrides)
    settings = Settings(**values)
    upgraded_database(settings.effective_database_url)
    return settings


@pytest.fixture(params=["local", "s3"])
def storage_url(request):
    if request.param == "local":
        return None
    return f"s3://{request.getfixturevalue('s3_bucket')}/cache-test"


#: For tests of what the cache key is made of and of the API's checks: the store of artifacts (the data directory
#: or S3, the only thing the two parameters change) plays no part in them; the tests that copy, serve and delete
#: cached results run on both.
KEY_AND_API_ONLY = pytest.mark.parametrize("storage_url", ["local"], indirect=True)


@pytest.fixture
def service(tmp_path, storage_url):
    """The API and one worker with the scripted engine, sharing the job table and the store."""
    settings = make_settings(tmp_path, storage_url)
    with TestClient(create_app(settings)) as client:
        worker = JobWorker(settings)
        worker.start()
        try:
            yield client, settings
        finally:
            worker.stop(timeout=5)


def attempts_run(settings: Settings, job_id: str) -> int:
    """Attempts the job table says were started for the job (a cached job starts none)."""
    store = JobStore(settings.effective_database_url)
    try:
        return store.get(job_id).attempt
    finally:
        store.dispose()


def download(client, job: dict) -> bytes:
    response = client.get(job["links"]["artifact"], follow_redirects=True)
    assert response.status_code == 200, response.text
    return response.content


def test_an_identical_submission_reuses_the_result_without_running(service):
    client, settings = service
    first = wait_done(client, post_model(client).json()["id"])
    assert first["status"] == "succeeded" and first["cached"] is False and first["cached_from"] is None

    started = time.perf_counter()
    response = post_model(client)
    elapsed = time.perf_counter() - started
    assert response.status_code == 202, response.text
    second = response.json()
    # Succeeded in the submission's own answer: nothing was queued, no attempt ran.
    assert second["status"] == "succeeded" and second["cached"] is True and second["cached_from"] == first["id"]
    assert second["id"] != first["id"] and second["attempt"] == 0 and attempts_run(settings, second["id"]) == 0
    assert second["artifact"]["sha256"] == first["artifact"]["sha256"]
    assert second["summary"] == first["summary"]
    assert hashlib.sha256(download(client, second)).hexdigest() == first["artifact"]["sha256"]
    assert client.get(second["links"]["report"]).json() == client.get(first["links"]["report"]).json()
    assert client.get(f"/jobs/{second['id']}").json()["cached"] is True
    print(f"cached submission answered in {elapsed * 1000:.1f} ms (in process, upload included)")


@KEY_AND_API_ONLY
def test_anything_that_changes_the_result_misses(service):
    client, settings = service
    first = wait_done(client, post_model(client, options={"opt_level": 1}).json()["id"])
    assert first["status"] == "succeeded"
    other_model = wait_done(client, post_model(client, model=MODEL + b"!", options={"opt_level": 1}).json()["id"])
    other_places = wait_done(client, post_model(client, places="x86/fp32/nchw", options={"opt_level": 1})
                             .json()["id"])
    other_options = wait_done(client, post_model(client, options={"opt_level": 2}).json()["id"])
    for job in (other_model, other_places, other_options):
        assert job["status"] == "succeeded" and job["cached"] is False and job["attempt"] == 1
    # The order of the options and their defaults do not matter: the spec is compared as the engine reads it.
    same = post_model(client, options={"verify": True, "opt_level": 1}).json()
    assert same["cached"] is True and same["cached_from"] == first["id"]


def test_cache_false_runs_again_and_its_result_is_reused_from_then_on(service):
    client, _ = service
    first = wait_done(client, post_model(client).json()["id"])
    forced = post_model(client, options={"cache": False}).json()
    assert forced["status"] == "queued" and forced["cached"] is False
    forced = wait_done(client, forced["id"])
    assert forced["status"] == "succeeded" and forced["attempt"] == 1 and forced["cached"] is False
    again = post_model(client).json()
    assert again["cached"] is True and again["cached_from"] in (first["id"], forced["id"])
    assert again["cached_from"] == forced["id"]  # the newest result


@KEY_AND_API_ONLY
def test_a_cache_option_must_be_a_boolean(service):
    client, _ = service
    body = assert_problem(post_model(client, options={"cache": "no"}), 422, field="options.cache")
    assert "cache must be true or false" in body["detail"]


def test_deleting_the_source_leaves_the_cached_job_whole(service):
    client, settings = service
    first = wait_done(client, post_model(client).json()["id"])
    cached = post_model(client).json()
    assert cached["cached_from"] == first["id"]
    report = client.get(cached["links"]["report"]).json()
    assert client.delete(f"/jobs/{first['id']}").status_code == 204
    assert client.get(f"/jobs/{first['id']}").status_code == 404
    after = client.get(f"/jobs/{cached['id']}").json()
    assert after["status"] == "succeeded" and after["cached_from"] == first["id"]
    assert hashlib.sha256(download(client, after)).hexdigest() == first["artifact"]["sha256"]
    assert client.get(after["links"]["report"]).json() == report
    # The cached job is a source in its turn.
    third = post_model(client).json()
    assert third["cached"] is True and third["cached_from"] == cached["id"]
    # With every holder of the result gone, the next submission runs.
    for job in (cached, third):
        assert client.delete(f"/jobs/{job['id']}").status_code == 204
    fresh = post_model(client).json()
    assert fresh["cached"] is False and wait_done(client, fresh["id"])["attempt"] == 1


def test_a_source_deleted_between_lookup_and_copy_lets_the_job_run(service, monkeypatch):
    client, settings = service
    first = wait_done(client, post_model(client).json()["id"])
    from app import services as app_services

    real_reuse = app_services.reuse_result

    def deleted_meanwhile(files, source_id, source_attempt, job_id):
        files.remove_job(source_id)  # as a concurrent DELETE /jobs/{id} or retention would
        return real_reuse(files, source_id, source_attempt, job_id)

    monkeypatch.setattr(app_services, "reuse_result", deleted_meanwhile)
    job = post_model(client).json()
    assert job["status"] == "queued" and job["cached"] is False
    assert wait_done(client, job["id"])["status"] == "succeeded"
    assert first["id"] != job["id"]


def test_the_deployment_can_turn_the_cache_off(tmp_path):
    settings = make_settings(tmp_path, None, cache=False)
    with TestClient(create_app(settings)) as client:
        worker = JobWorker(settings)
        worker.start()
        try:
            first = wait_done(client, post_model(client).json()["id"])
            second = post_model(client).json()
            assert second["status"] == "queued" and second["cached"] is False
            assert wait_done(client, second["id"])["attempt"] == 1 and first["status"] == "succeeded"
        finally:
            worker.stop(timeout=5)


def test_the_cache_key_names_the_engine_and_its_plugins():
    spec = JobSpec("x86/fp32/nchw", {"opt_level": 2})
    identity = engine_identity()
    assert identity["version"] and isinstance(identity["plugins"], list)
    key = cache_key("a" * 64, spec, identity)
    assert key == cache_key("a" * 64, JobSpec("x86/fp32/nchw", {"opt_level": 2}, cache=False), identity)
    assert key != cache_key("b" * 64, spec, identity)
    assert key != cache_key("a" * 64, JobSpec("arm/fp32/nchw", {"opt_level": 2}), identity)
    assert key != cache_key("a" * 64, spec, {**identity, "version": identity["version"] + "+other"})
    plugin = {"origin": "acme_npu.py@sha256:" + "0" * 64, "status": "loaded", "provides": {"targets": ["acme"]}}
    assert key != cache_key("a" * 64, spec, {**identity, "plugins": identity["plugins"] + [plugin]})


@KEY_AND_API_ONLY
def test_a_job_is_offered_for_reuse_under_the_key_of_the_engine_that_ran_it(service):
    client, settings = service
    job = wait_done(client, post_model(client).json()["id"])
    store = JobStore(settings.effective_database_url)
    try:
        row = store.get(job["id"])
    finally:
        store.dispose()
    assert row.cache_key == cache_key(row.input_sha256, row.spec, engine_identity())


def test_results_are_reused_within_one_owner_only(store):
    """With API keys, one owner's job never answers another's: a hit would tell that the other submitted it."""
    from dataclasses import replace

    from tests.service.conftest import new_job

    spec = JobSpec("x86/fp32/nchw", {"opt_level": 2})
    key = cache_key("a" * 64, spec, engine_identity())
    for owner in ("alice", None):
        job = store.create(replace(new_job(), spec=spec, input_sha256="a" * 64, owner=owner))
        lease = store.claim(job.id, "w", 30).lease
        assert store.publish(lease, artifact_bytes=1, artifact_sha256="b" * 64, summary={}, cache_key=key)
    alice = store.find_cached(key, owner="alice")
    assert alice is not None and alice.owner == "alice"
    assert store.find_cached(key, owner="bob") is None
    anonymous = store.find_cached(key)
    assert anonymous is not None and anonymous.owner is None and anonymous.id != alice.id
    assert store.find_cached("c" * 64, owner="alice") is None
