"""schemathesis against the app: generated requests for every operation find no server error and no response
that contradicts the OpenAPI document (status codes, media types, headers, bodies).

The schema is loaded eagerly (schemathesis's lazy ``from_fixture`` does not work with this pytest), on an app
over a real SQLite job table and queue in a temporary directory, with an embedded worker running the scripted
engine (so that readiness holds and accepted jobs really run). The app asks for API keys, /metrics included,
as an exposed deployment does: every request carries a user's key, and schemathesis's own check that an
operation refuses requests without valid credentials runs on every operation that declares the key.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from app.main import create_app
from app.settings import Settings
from tests.service.conftest import FAKE_ENGINE, upgraded_database
from worker.jobs import JobStore, KeyStore
from worker.jobs.consumer import JobWorker

DATA_DIR = Path(tempfile.mkdtemp(prefix="mirserve-schemathesis-"))
atexit.register(shutil.rmtree, DATA_DIR, True)  # also when these tests are collected but not run
SETTINGS = Settings(data_dir=DATA_DIR, max_upload_mb=0.25, engine=FAKE_ENGINE, job_memory_mb=1024, auth="keys",
                    metrics_auth=True)
upgraded_database(SETTINGS.effective_database_url)
_store = JobStore(SETTINGS.effective_database_url)
TOKEN = KeyStore(_store).create("schemathesis")[1]
_store.dispose()
APP = create_app(SETTINGS)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
#: Per operation, whether some request got past authentication (an answer neither 401 nor routing's own).
AUTHENTICATED: dict[str, bool] = {}


@pytest.fixture(scope="module", autouse=True)
def _worker():
    worker = JobWorker(SETTINGS)
    worker.start()
    yield
    worker.stop(timeout=5)
    APP.state.services.close()
    only_refused = sorted(op for op, passed in AUTHENTICATED.items() if not passed)
    assert not only_refused, f"no request got past authentication on {only_refused}"


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_error_and_no_schema_violation(case):
    # On POST /optimize two heuristics do not apply, while every conformance check still does:
    # - "valid data is accepted": a schema-valid form can name an unknown place or option or reuse an
    #   Idempotency-Key (JSON Schema cannot express the place grammar or options inside a form field), and
    #   the documented answer is 422;
    # - "invalid data is rejected": a generated empty array for an optional text field is sent as no part at
    #   all, which is a valid form (places then defaults to x86/fp32/nchw).
    excluded = [positive_data_acceptance, negative_data_rejection] if case.operation.path == "/optimize" else []
    # schemathesis generates the Authorization header of the declared bearer scheme, with a random token, and
    # leaves it out on purpose in negative cases: a generated one becomes the real key, a missing one stays so.
    if case.headers and "Authorization" in case.headers:
        case.headers["Authorization"] = f"Bearer {TOKEN}"
    response = case.call_and_validate(excluded_checks=excluded)
    problem = response.json() if "problem+json" in response.headers.get("content-type", [""])[0] else {}
    passed = response.status_code != 401 and problem.get("type") != "about:blank"
    AUTHENTICATED[case.operation.label] = AUTHENTICATED.get(case.operation.label, False) or passed
