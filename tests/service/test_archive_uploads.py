"""Archive uploads over real HTTP (``mirserve serve``, the real engine): a model with external data as .zip,
.tar and .tar.gz optimizes and verifies; every hostile archive is a 422 naming the member with nothing kept;
an external-data location outside the archive fails the job naming it."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest

from tests.service.archives import HOSTILE_CASES, hostile, model_naming, model_with_external_data, pack, pack_directory

PLACES = "x86/fp32/nchw"


@pytest.fixture(scope="module")
def server(real_server):
    """The session's ``mirserve serve`` (tests/conftest.py), whose settings are the ones this module needs (a
    64 MB upload cap, the real engine): a server of its own cost another start of one (about 2 s on each
    xdist worker that ran a test of this module). Each test looks only at its own job, or compares the data
    directory before and after its own request."""
    return real_server


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return model_with_external_data(tmp_path_factory.mktemp("source"))


def files_outside_the_database(server) -> set[str]:
    """Everything in the data directory but the job table and the queue (which a submission may touch)."""
    return {str(p.relative_to(server.data_dir)) for p in server.data_dir.rglob("*")
            if not p.name.startswith(("mirserve.db", "queue", "huey")) and p.is_file()}


def run(model: bytes | str, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", ["zip", "tar", "tar.gz"])
def test_a_model_with_external_data_in_an_archive_optimizes_and_verifies(server, source, kind):
    response = server.submit(pack_directory(kind, source.parent), PLACES, filename=f"model.{kind}")
    assert response.status_code == 202, response.text
    job = server.wait_for(response.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["summary"]["verified"] is True
    artifact = server.client.get(f"/jobs/{job['id']}/artifact")
    assert artifact.status_code == 200
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    np.testing.assert_allclose(run(artifact.content, x), run(str(source), x), rtol=1e-5, atol=1e-5)
    assert job["summary"]["nodes_after"] == 1  # MatMul + Add became one Gemm: the weights were read


@pytest.mark.parametrize("case", HOSTILE_CASES)
def test_a_hostile_archive_is_422_naming_the_member_and_nothing_is_kept(server, source, case, tmp_path):
    data, member = hostile(source.read_bytes())[case]
    before = files_outside_the_database(server)
    response = server.submit(data, PLACES, filename="model.tar")
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"].endswith("/invalid-archive") and problem["field"] == "model"
    assert problem["member"] == member and repr(member) in problem["detail"]
    assert files_outside_the_database(server) == before
    assert not (server.data_dir.parent / "mirserve-escape.bin").exists()


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/hostname", "sub/../../secret.bin"])
def test_an_external_data_location_outside_the_archive_fails_the_job_naming_it(server, location):
    (server.data_dir.parent / "secret.bin").write_bytes(b"s" * 16)
    response = server.submit(pack("tar.gz", {"model.onnx": model_naming(location), "sub/x.bin": b"x"}), PLACES,
                             filename="model.tar.gz")
    assert response.status_code == 202, response.text
    job = server.wait_for(response.json()["id"])
    assert job["status"] == "failed"
    assert job["error"]["field"] == "model" and repr(location) in job["error"]["message"], job["error"]
    assert server.client.get(f"/jobs/{job['id']}/artifact").status_code == 409
