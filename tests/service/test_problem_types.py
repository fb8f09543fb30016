"""Every problem type the service can answer resolves to a page that explains it."""
from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from app.problem_types import PROBLEM_TYPES

APP = Path(__file__).resolve().parents[2] / "app"
#: ``NotFound("job-not-found", ...)``, ``ProblemError(422, "invalid-request", ...)``, ``slug="not-ready"``.
RAISED = re.compile(r"""(?:\b[A-Z]\w*\(\s*(?:\d{3},\s*)?|\bslug=)["']([a-z][a-z0-9]*(?:-[a-z0-9]+)+)["']""")


def slugs_in_code() -> set[str]:
    found = set()
    for path in APP.rglob("*.py"):
        if path.name != "problem_types.py":
            found.update(RAISED.findall(path.read_text(encoding="utf-8")))
    return found


def test_every_problem_the_code_raises_is_explained():
    raised = slugs_in_code()
    assert {"job-not-found", "invalid-option", "upload-too-large", "internal-error", "not-ready"} <= raised
    assert sorted(raised - set(PROBLEM_TYPES)) == []


def test_each_problem_type_has_a_page_and_the_list_links_them(tmp_path):
    from app.main import create_app
    from app.settings import Settings
    from tests.service.conftest import upgraded_database

    settings = Settings(data_dir=tmp_path / "data")
    upgraded_database(settings.effective_database_url)
    with TestClient(create_app(settings)) as client:
        listing = client.get("/problems").text
        for slug, kind in PROBLEM_TYPES.items():
            page = client.get(f"/problems/{slug}")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert f"<h1>{kind.title}</h1>" in page.text and f'href="/problems/{slug}"' in listing
        missing = client.get("/problems/no-such-kind")
        assert missing.status_code == 404 and missing.json()["type"] == "/problems/problem-type-not-found"
        problem = client.get("/jobs/nope").json()
        assert client.get(problem["type"]).status_code == 200
