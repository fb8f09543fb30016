"""The optional OIDC mode: JWTs of an identity provider, checked against its JWKS (served here by a local HTTP
server), accepted beside the API keys; owner from ``sub``, admin from the roles claim; every bad token a 401."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.service.conftest import upgraded_database
from tests.service.test_api import assert_problem, post_model
from worker.jobs import JobStore, KeyStore

ISSUER, AUDIENCE = "https://idp.example/realms/ml", "mirserve"


@pytest.fixture(scope="module")
def signing_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def jwks_url(signing_key):
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    body = json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/certs"
    server.shutdown()


@pytest.fixture
def client(tmp_path, jwks_url):
    settings = Settings(data_dir=tmp_path / "data", auth="keys", oidc_issuer=ISSUER, oidc_jwks_url=jwks_url,
                        oidc_audience=AUDIENCE)
    upgraded_database(settings.effective_database_url)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def token(key, kid="k1", algorithm="RS256", **claims) -> dict[str, str]:
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300, **claims}
    payload = {k: v for k, v in payload.items() if v is not None}
    return {"Authorization": f"Bearer {jwt.encode(payload, key, algorithm=algorithm, headers={'kid': kid})}"}


def test_a_providers_token_names_the_owner_and_its_roles_make_an_admin(client, signing_key):
    alice = post_model(client, headers=token(signing_key)).json()["id"]
    assert client.get(f"/jobs/{alice}", headers=token(signing_key)).status_code == 200
    assert client.get(f"/jobs/{alice}", headers=token(signing_key, sub="bob")).status_code == 404
    admin = token(signing_key, sub="ops", roles=["viewer", "mirserve-admin"])
    assert [j["id"] for j in client.get("/jobs", headers=admin).json()["items"]] == [alice]
    assert client.get("/jobs", headers=token(signing_key, sub="eve", roles="viewer")).json()["items"] == []


def test_api_keys_still_work_beside_the_provider(client):
    store = JobStore(client.app.state.services.settings.effective_database_url)
    _, key = KeyStore(store).create("carol")
    store.dispose()
    assert client.get("/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_every_bad_token_is_a_401(client, signing_key):
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    bad = {
        "expired": token(signing_key, exp=now - 120),
        "another issuer": token(signing_key, iss="https://evil.example"),
        "another audience": token(signing_key, aud="someone-else"),
        "no expiry": token(signing_key, exp=None),
        "no owner": token(signing_key, sub=None),
        "signed by another key": token(other),
        "unknown key id": token(signing_key, kid="k2"),
        "hmac with the public key": {"Authorization": "Bearer " + jwt.encode(
            {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": now + 60}, "s" * 32, algorithm="HS256",
            headers={"kid": "k1"})},
        "not a jwt": {"Authorization": "Bearer abc.def.ghi"},
    }
    for why, headers in bad.items():
        body = assert_problem(client.get("/jobs", headers=headers), 401)
        assert body["detail"], why


def test_an_issuer_without_keys_or_audience_is_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="MIRSERVE_OIDC_JWKS_URL and MIRSERVE_OIDC_AUDIENCE"):
        Settings(data_dir=tmp_path, oidc_issuer=ISSUER)
