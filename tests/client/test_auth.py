"""The client and the remote commands against a service that asks for API keys (MIRSERVE_AUTH=keys): the key
given as ``token=`` or MIRSERVE_TOKEN goes as a bearer token, a missing or revoked one is ``Unauthorized``
(one line from the commands), and another owner's job is ``NotFound``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.client import Client
from app.client.errors import NotFound, Unauthorized
from tests.client.conftest import MODEL_BYTES, running_service
from worker.jobs import JobStore, KeyStore


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("client-auth") / "data", auth="keys") as running:
        store = JobStore(running.settings.effective_database_url)
        keys = KeyStore(store)
        running.tokens = {owner: keys.create(owner)[1] for owner in ("alice", "bob")}
        running.keys = keys
        yield running
        store.dispose()


@pytest.fixture
def remote(monkeypatch, capsys):
    """``mirserve ARGS`` with MIRSERVE_SERVER, MIRSERVE_TOKEN (when given) and the working directory set, run
    by the program's own ``main`` in this process: what it prints and its exit status.

    A process per command cost each about half a second of interpreter start and imports (app.cli imports the
    engine's command line); what these tests are about (the key from MIRSERVE_TOKEN going as a bearer
    token, a refusal printed as one line with status 1) is the same in process. The program as a process is
    what tests/client/test_remote_cli.py runs."""
    from app.cli import main

    def run(*args: str, server, token: str | None, cwd: Path) -> subprocess.CompletedProcess:
        with monkeypatch.context() as patched:
            patched.setenv("MIRSERVE_SERVER", server.url)
            patched.setenv("COLUMNS", "110")
            patched.delenv("MIRSERVE_TOKEN", raising=False)
            if token is not None:
                patched.setenv("MIRSERVE_TOKEN", token)
            patched.chdir(cwd)
            capsys.readouterr()
            try:
                status = main(list(args))
            except SystemExit as exit:  # as the interpreter would end: a message is printed, status 1
                status = exit.code if isinstance(exit.code, int) or exit.code is None else 1
                if not isinstance(exit.code, int) and exit.code is not None:
                    print(exit.code, file=sys.stderr)
            out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["mirserve", *args], status or 0, out, err)

    return run


def test_the_client_sends_its_key_and_sees_only_its_owners_jobs(keyed, model_file, monkeypatch):
    with Client(keyed.url, token=keyed.tokens["alice"]) as alice:
        job = alice.submit(model_file).wait(timeout=30, poll_interval=0.05)  # not the 2 s of Retry-After
        assert job.status == "succeeded"
        downloaded = job.download(model_file.parent / "out.onnx")
        assert downloaded.read_bytes() == MODEL_BYTES
        assert [j.id for j in alice.list_jobs()["items"]] == [job.id]
    monkeypatch.setenv("MIRSERVE_TOKEN", keyed.tokens["bob"])
    with Client(keyed.url) as bob:  # the key from MIRSERVE_TOKEN
        assert bob.list_jobs()["items"] == []
        with pytest.raises(NotFound):
            bob.job(job.id)
        with pytest.raises(NotFound):
            bob.cancel(job.id)
    monkeypatch.delenv("MIRSERVE_TOKEN")
    with Client(keyed.url) as nobody:
        with pytest.raises(Unauthorized, match="API key"):
            nobody.list_jobs()
        assert nobody.health()["status"] == "ok"


def test_submit_jobs_job_and_cancel_commands_work_with_a_key_and_refuse_without(keyed, model_file, tmp_path,
                                                                                remote):
    alice, bob = keyed.tokens["alice"], keyed.tokens["bob"]
    submitted = remote("submit", str(model_file), "--wait", "-o", "out.onnx", server=keyed, token=alice,
                       cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert (tmp_path / "out.onnx").read_bytes() == MODEL_BYTES
    listed = remote("jobs", "--json", server=keyed, token=alice, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    import json

    job_id = json.loads(listed.stdout)["items"][0]["id"]
    shown = remote("job", job_id, server=keyed, token=alice, cwd=tmp_path)
    assert shown.returncode == 0 and job_id in shown.stdout, shown.stderr
    finished = remote("cancel", job_id, server=keyed, token=alice, cwd=tmp_path)
    assert finished.returncode == 1 and "already succeeded" in finished.stderr  # reached the job: it is alice's
    for args in (("job", job_id), ("cancel", job_id)):
        foreign = remote(*args, server=keyed, token=bob, cwd=tmp_path)
        assert foreign.returncode == 1 and f"there is no job '{job_id}'" in foreign.stderr, foreign.stderr
    refused = remote("jobs", server=keyed, token=None, cwd=tmp_path)
    assert refused.returncode == 1 and "API key" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    revoked_key, revoked = keyed.keys.create("carol")
    keyed.keys.revoke(revoked_key.id)
    refused = remote("submit", str(model_file), server=keyed, token=revoked, cwd=tmp_path)
    assert refused.returncode == 1 and "revoked" in refused.stderr, refused.stderr
