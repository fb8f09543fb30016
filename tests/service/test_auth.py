"""API keys and ownership (issue 14, item 2), in process on a real SQLite job table with MIRSERVE_AUTH=keys.

The routes under test are read from the app itself, so a route added later is covered without editing this
file: every route but the open ones answers 401 without a key, and every route with a job id answers 404 for
another owner's job, exactly as for a job that does not exist.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.auth import InsecureBind, is_loopback
from app.cli import main
from app.main import create_app
from app.settings import Settings
from tests.service.conftest import FAKE_ENGINE, upgraded_database
from tests.service.test_api import MODEL, assert_problem, post_model
from worker.jobs import JobStore, KeyStore
from worker.jobs.db import write_transaction
from worker.jobs.store import api_keys_table

#: Routes anyone may call: liveness and readiness, the API's own description, static files, problem pages.
OPEN_PATHS = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/problems", "/problems/{slug}"}


@pytest.fixture
def settings(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", max_upload_mb=0.5, engine=FAKE_ENGINE, job_memory_mb=1024,
                        auth="keys")
    upgraded_database(settings.effective_database_url)
    return settings


@pytest.fixture
def keys(settings):
    store = JobStore(settings.effective_database_url)
    yield KeyStore(store)
    store.dispose()


@pytest.fixture
def client(settings):
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tokens(keys) -> dict[str, str]:
    return {name: keys.create(name, role)[1] for name, role in (("alice", "user"), ("bob", "user"),
                                                                 ("root", "admin"))}


def protected_routes(app) -> list[tuple[str, str]]:
    """(method, path template) of every route that is not open, read from the app (routers included)."""
    found = []
    for route in iter_route_contexts(app.routes):
        if route.methods is None:  # a mount: only the static files (CSS, scripts, Swagger UI) may be one
            assert route.path == "/static", f"{route.path} is mounted: is it open on purpose?"
            continue
        if route.path not in OPEN_PATHS:
            found += [(method, route.path) for method in sorted(route.methods - {"HEAD"})]
    return found


def concrete(path: str, job_id: str) -> str:
    return re.sub(r"\{[^}]+\}", lambda m: job_id if m[0] == "{job_id}" else "x", path)


def test_the_routes_enumerated_cover_the_api_and_the_job_pages(client):
    routes = protected_routes(client.app)
    paths = {path for _method, path in routes}
    assert {"/optimize", "/jobs", "/jobs/{job_id}", "/jobs/{job_id}/artifact", "/jobs/{job_id}/cancel",
            "/passes", "/", "/ui/jobs/{job_id}"} <= paths
    assert ("DELETE", "/jobs/{job_id}") in routes and len(routes) >= 18


def test_without_a_key_every_protected_route_answers_401_with_a_bearer_challenge(client, tokens):
    job_id = post_model(client, headers=bearer(tokens["alice"])).json()["id"]
    for method, path in protected_routes(client.app):
        response = client.request(method, concrete(path, job_id))
        body = assert_problem(response, 401)
        assert body["type"] == "/problems/unauthorized" and "Authorization: Bearer" in body["detail"], (method, path)
        assert response.headers["www-authenticate"] == 'Bearer realm="mirserve"'
    assert client.get(f"/jobs/{job_id}", headers=bearer(tokens["alice"])).json()["status"] == "queued"


@pytest.mark.parametrize("token", ["", "msk_", "not-a-key", "msk_0123456789abcdef_" + "a" * 43,
                                   "msk_zzzz_abc", "msk_0123456789abcdef_" + "é" * 30, "x" * 5000])
def test_a_malformed_or_unknown_key_is_a_401_never_an_error(client, tokens, token):
    response = client.get("/jobs", headers={"Authorization": f"Bearer {token}".encode()})
    assert_problem(response, 401)


def test_a_key_is_hashed_at_the_production_scrypt_cost(monkeypatch, keys):
    monkeypatch.undo()  # tests/conftest.py makes hashing cheap for every other test
    key, token = keys.create("carol")
    with keys.store.engine.connect() as conn:
        stored = conn.execute(api_keys_table.select().where(api_keys_table.c.id == key.id)).one().secret_hash
    assert stored.startswith("scrypt$16384$8$1$")
    assert keys.authenticate(token) == key


def test_a_wrong_secret_for_a_real_key_id_is_refused(client, tokens):
    key_id = tokens["alice"].split("_")[1]
    forged = f"msk_{key_id}_{'A' * 43}"
    body = assert_problem(client.get("/jobs", headers=bearer(forged)), 401)
    assert body["detail"] == "the API key is not valid"
    assert client.get("/jobs", headers=bearer(tokens["alice"])).status_code == 200  # the real one still works
    assert_problem(client.get("/jobs", headers=bearer(forged)), 401)  # and after it, the forged one still not


def test_another_owners_job_is_404_on_every_job_route_like_a_missing_one(client, tokens):
    alice = post_model(client, headers=bearer(tokens["alice"])).json()["id"]
    job_routes = [(m, p) for m, p in protected_routes(client.app) if "{job_id}" in p]
    assert len(job_routes) >= 12
    nobody = "00000000-0000-0000-0000-000000000000"
    for method, path in job_routes:
        foreign = client.request(method, concrete(path, alice), headers=bearer(tokens["bob"]))
        missing = client.request(method, concrete(path, nobody), headers=bearer(tokens["bob"]))
        assert foreign.status_code == missing.status_code == 404, (method, path, foreign.text)
        assert foreign.json()["type"] == "/problems/job-not-found", (method, path)
        assert foreign.text.replace(alice, nobody) == missing.text, (method, path)  # nothing tells them apart
    job = client.get(f"/jobs/{alice}", headers=bearer(tokens["alice"])).json()
    assert job["status"] == "queued"  # bob's cancel and delete did nothing


def test_a_user_lists_only_its_own_jobs_and_an_admin_sees_all(client, tokens):
    mine = {post_model(client, headers=bearer(tokens["alice"])).json()["id"] for _ in range(2)}
    theirs = post_model(client, headers=bearer(tokens["bob"])).json()["id"]
    listed = lambda who: {j["id"] for j in client.get("/jobs", headers=bearer(tokens[who])).json()["items"]}  # noqa: E731
    assert listed("alice") == mine and listed("bob") == {theirs}
    assert listed("root") == mine | {theirs}
    assert client.get("/jobs", headers=bearer(tokens["alice"])).json()["total"] == 2
    for job_id in mine | {theirs}:
        assert client.get(f"/jobs/{job_id}", headers=bearer(tokens["root"])).status_code == 200
    page = client.get("/", headers=bearer(tokens["bob"])).text
    assert theirs in page and not any(job_id in page for job_id in mine)
    assert client.post(f"/jobs/{theirs}/cancel", headers=bearer(tokens["root"])).json()["status"] == "canceled"
    assert client.delete(f"/jobs/{theirs}", headers=bearer(tokens["root"])).status_code == 204


def test_revoked_and_expired_keys_are_refused(client, keys, settings):
    key, token = keys.create("carol", "user", datetime.now(timezone.utc) + timedelta(days=1))
    assert client.get("/jobs", headers=bearer(token)).status_code == 200
    with write_transaction(keys.store.engine) as conn:
        conn.execute(update(api_keys_table).where(api_keys_table.c.id == key.id)
                     .values(expires_at=datetime.now(timezone.utc) - timedelta(seconds=1)))
    body = assert_problem(client.get("/jobs", headers=bearer(token)), 401)
    assert body["detail"] == "the API key has expired"
    assert client.get("/jobs", headers=bearer(token)).headers["www-authenticate"].endswith('error="invalid_token"')

    other, token = keys.create("carol")
    assert client.get("/jobs", headers=bearer(token)).status_code == 200
    assert keys.revoke(other.id).revoked_at is not None
    body = assert_problem(client.get("/jobs", headers=bearer(token)), 401)  # at once, though verified before
    assert body["detail"] == "the API key was revoked"


def test_health_checks_stay_open_and_metrics_closes_on_request(settings, tokens):
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code in (200, 503)  # open: no worker here, so not ready
        assert client.get("/metrics").status_code == 200
    with TestClient(create_app(settings.model_copy(update={"metrics_auth": True}))) as client:
        assert_problem(client.get("/metrics"), 401)
        assert client.get("/metrics", headers=bearer(tokens["bob"])).status_code == 200
        assert client.get("/healthz").status_code == 200


def test_idempotency_keys_are_each_owners_own(client, tokens):
    headers = lambda who: {**bearer(tokens[who]), "Idempotency-Key": "same-key"}  # noqa: E731
    first = post_model(client, headers=headers("alice")).json()["id"]
    assert post_model(client, headers=headers("alice")).json()["id"] == first
    other = post_model(client, headers=headers("bob"))
    assert other.status_code == 202 and other.json()["id"] != first
    different = post_model(client, model=MODEL + b"!", headers=headers("bob"))
    assert assert_problem(different, 422)["job_id"] == other.json()["id"]  # bob's own job, never alice's


def test_without_keys_the_service_refuses_a_non_loopback_address(tmp_path):
    base = dict(data_dir=tmp_path / "data", auth="none")
    for host in ("0.0.0.0", "::", "192.168.1.20", "example.com"):
        assert not is_loopback(host)
        with pytest.raises(InsecureBind, match="MIRSERVE_ALLOW_INSECURE=1"):
            create_app(Settings(**base, host=host))
    for host in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"):
        assert is_loopback(host)
    upgraded_database(Settings(**base).effective_database_url)
    for allowed in (dict(allow_insecure=True), dict(auth="keys")):
        create_app(Settings(**{**base, **allowed}, host="0.0.0.0")).state.services.close()


def test_api_and_serve_commands_refuse_to_start_exposed_without_keys(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRSERVE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MIRSERVE_AUTH", "none")
    monkeypatch.setenv("MIRSERVE_HOST", "127.0.0.1")  # --host goes into the environment: undone after the test
    for command in ("api", "serve"):
        with pytest.raises(SystemExit) as refused:
            main([command, "--host", "0.0.0.0"])
        assert "MIRSERVE_AUTH=none on 0.0.0.0" in str(refused.value)
        assert "MIRSERVE_ALLOW_INSECURE=1" in str(refused.value)


def test_keys_command_creates_lists_and_revokes(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MIRSERVE_DATA_DIR", str(tmp_path))
    assert main(["keys", "create", "--owner", "dana", "--role", "admin", "--expires", "30d"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert re.fullmatch(r"msk_[0-9a-f]{16}_[A-Za-z0-9_-]{43}", token) and "only time" in err
    key_id = token.split("_")[1]
    settings = Settings(data_dir=tmp_path, auth="keys")
    with TestClient(create_app(settings)) as client:
        assert client.get("/jobs", headers=bearer(token)).status_code == 200
        assert main(["keys", "list"]) == 0
        listing = capsys.readouterr().out
        assert key_id in listing and "dana" in listing and "admin" in listing and token.split("_", 2)[2] not in listing
        assert main(["keys", "revoke", key_id]) == 0
        assert "revoked" in capsys.readouterr().out
        assert_problem(client.get("/jobs", headers=bearer(token)), 401)
    for argv, message in ((["keys", "revoke", "nope"], "there is no API key 'nope'"),
                          (["keys", "create", "--owner", "bad name"], "is not allowed"),
                          (["keys", "create", "--owner", "x", "--expires", "soon"], "neither a duration"),
                          (["keys", "create", "--owner", "x", "--expires", "2001-01-01"], "not in the future")):
        with pytest.raises(SystemExit, match=message):
            main(argv)
    store = JobStore(settings.effective_database_url)
    with store.engine.connect() as conn:
        row = conn.execute(api_keys_table.select()).one()
    store.dispose()
    assert row.revoked_at is not None and row.secret_hash.startswith("scrypt$")
    assert token.split("_", 2)[2] not in str(tuple(row))  # only the hash of the secret is kept
