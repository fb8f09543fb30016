"""``app.cli``: the engine's program plus the service's commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.cli import main
from tests.service.server import REPO


def test_the_program_has_the_engine_and_service_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for command in ("optimize", "passes", "serve", "api", "worker", "openapi"):
        assert command in text


def test_engine_commands_still_work_through_it(capsys):
    assert main(["passes", "--json"]) == 0
    assert "type_inference" in {p["name"] for p in json.loads(capsys.readouterr().out)["passes"]}


def test_openapi_writes_the_committed_document(tmp_path):
    target = tmp_path / "openapi.json"
    assert main(["openapi", "-o", str(target)]) == 0
    assert target.read_text() == (REPO / "openapi" / "openapi.json").read_text()


@pytest.mark.parametrize("command, variables, words", [
    ("worker", {"MIRSERVE_LEASE_SECONDS": "2", "MIRSERVE_HEARTBEAT_SECONDS": "5"},
     "MIRSERVE_HEARTBEAT_SECONDS (5.0) must be"),
    ("worker", {"MIRSERVE_WORKER_CONCURRENCY": "many"}, "MIRSERVE_WORKER_CONCURRENCY: Input should be a valid integer"),
    ("api", {"MIRSERVE_PORT": "http"}, "MIRSERVE_PORT: Input should be a valid integer"),
    ("serve", {"MIRSERVE_JOB_NICE": "40"}, "MIRSERVE_JOB_NICE: Input should be less than or equal to 19"),
])
def test_bad_settings_stop_the_command_with_the_variable_named(monkeypatch, tmp_path, command, variables, words):
    for name, value in {"MIRSERVE_DATA_DIR": str(tmp_path), **variables}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        main([command])
    assert words in str(stopped.value)


def test_a_client_command_does_not_load_the_job_store_or_settings():
    """``mirserve submit`` and the like talk HTTP: the job side's database, queue and settings libraries are
    left unloaded (about 0.5 s of every such command)."""
    code = ("import sys\nfrom app.cli import main\ntry:\n    main(['jobs', '--help'])\nexcept SystemExit:\n    pass\n"
            "print([m for m in ('sqlalchemy', 'alembic', 'huey', 'pydantic_settings') if m in sys.modules], "
            "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and "usage:" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "[]"
