"""The artifact as one archive, and resumable downloads: a model with external data comes as a tar of both
files under the names the model refers to, any byte range of it (or of the model) can be fetched again."""
from __future__ import annotations

import io
import tarfile

import pytest

from app.downloads import TarMember, TarOfFiles, requested_range
from tests.service.test_api import _script, client, post_model, settings, wait_done  # noqa: F401 - fixtures
from worker.jobs.consumer import JobWorker


def member(name: str, data: bytes) -> TarMember:
    return TarMember(name, len(data), lambda offset: iter([data[offset:offset + 7], data[offset + 7:]]))


def test_every_byte_range_of_a_tar_of_files_is_that_range_of_the_whole_archive():
    files = {"model.opt.onnx": b"m" * 1000, "model.onnx.data": bytes(range(256)) * 3, "empty": b""}
    archive = TarOfFiles([member(n, d) for n, d in files.items()], mtime=1700000000)
    whole = b"".join(archive.read())
    assert len(whole) == archive.size and archive.size % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(whole)) as unpacked:
        assert {m.name: unpacked.extractfile(m).read() for m in unpacked.getmembers()} == files
    for start, end in [(0, 1), (511, 513), (600, 1600), (1500, archive.size), (archive.size - 1, archive.size)]:
        assert b"".join(archive.read(start, end)) == whole[start:end], (start, end)


@pytest.mark.parametrize("header, expected", [
    (None, None), ("bytes=0-9", (0, 10)), ("bytes=90-", (90, 100)), ("bytes=-10", (90, 100)),
    ("bytes=95-200", (95, 100)), ("bytes=100-", "unsatisfiable"), ("bytes=0-1,5-6", None), ("bytes=9-3", None),
    ("items=0-1", None), ("bytes=-0", "unsatisfiable")])
def test_range_headers(header, expected):
    assert requested_range(header, 100) == expected


@pytest.fixture
def finished(client, settings):
    """A job whose model has external data (as the engine writes one over 2 GB), and one without."""
    plain, big = post_model(client).json(), post_model(client).json()
    job_worker = JobWorker(settings)
    _script(job_worker, big["id"], {"external_data": True})
    job_worker.start()
    try:
        return wait_done(client, plain["id"]), wait_done(client, big["id"])
    finally:
        job_worker.stop(timeout=5)


def test_the_artifact_archive_holds_the_model_and_its_data_and_resumes(client, finished):
    plain, big = finished
    model = client.get(big["links"]["artifact"]).content
    response = client.get(big["artifact"]["archive_url"])
    assert response.status_code == 200 and response.headers["accept-ranges"] == "bytes"
    assert response.headers["content-type"] == "application/x-tar"
    assert 'filename="det.opt.tar"' in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content)) as unpacked:
        found = {m.name: unpacked.extractfile(m).read() for m in unpacked.getmembers()}
    assert found == {"det.opt.onnx": model, "model.onnx.data": b"weights" * 100}
    etag = response.headers["etag"]
    part = client.get(big["links"]["artifact"] + "/archive", headers={"Range": "bytes=700-", "If-Range": etag})
    assert part.status_code == 206 and part.content == response.content[700:]
    assert part.headers["content-range"] == f"bytes 700-{len(response.content) - 1}/{len(response.content)}"
    stale = client.get(big["links"]["artifact"] + "/archive", headers={"Range": "bytes=700-", "If-Range": '"x"'})
    assert stale.status_code == 200 and stale.content == response.content  # another archive: all of it
    beyond = client.get(big["links"]["artifact"] + "/archive", headers={"Range": f"bytes={len(response.content)}-"})
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(response.content)}"
    alone = client.get(plain["links"]["artifact"] + "/archive")
    with tarfile.open(fileobj=io.BytesIO(alone.content)) as unpacked:
        assert unpacked.getnames() == ["det.opt.onnx"]


def test_the_model_and_its_data_download_by_ranges_too(client, finished):
    _, big = finished
    for url in (big["links"]["artifact"], big["artifact"]["data_url"]):
        whole = client.get(url)
        part = client.get(url, headers={"Range": "bytes=10-19", "If-Range": whole.headers["etag"]})
        assert part.status_code == 206 and part.content == whole.content[10:20], url


def test_a_range_beyond_the_end_is_a_416_problem_and_a_malformed_one_gets_everything(client, finished):
    plain, _ = finished
    url = plain["artifact"]["url"]
    size = plain["artifact"]["bytes"]
    beyond = client.get(url, headers={"Range": f"bytes={size}-"})
    assert beyond.status_code == 416 and beyond.headers["content-type"] == "application/problem+json"
    assert beyond.headers["content-range"] == f"bytes */{size}"
    whole = client.get(url, headers={"Range": "bytes=abc"})
    assert whole.status_code == 200 and len(whole.content) == size


def test_the_archive_of_a_job_that_has_not_succeeded_is_409(client):
    job = post_model(client).json()
    assert client.get(job["links"]["artifact"] + "/archive").status_code == 409
