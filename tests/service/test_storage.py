"""One contract for the stores, run on the data directory and on S3 (moto's standalone server over HTTP)."""
from __future__ import annotations

import hashlib
import os
import time

import httpx
import pytest

from worker.jobs.storage import LocalStorage, ObjectMissing, ObjectTooLarge, open_storage

BIG = os.urandom(1 << 20) * 9 + b"tail"  # more than one 8 MiB part


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        store = LocalStorage(tmp_path / "data")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        store = open_storage(f"s3://{bucket}/some/prefix", tmp_path / "data")
    yield store
    store.close()


def write_in_pieces(storage, key: str, data: bytes, piece: int = 1 << 20):
    writer = storage.writer(key)
    for start in range(0, len(data), piece):
        writer.write(data[start:start + piece])
        if writer.due:
            writer.flush()
    return writer


def test_a_streamed_write_appears_whole_on_commit_and_reads_back_every_way(storage, tmp_path):
    writer = write_in_pieces(storage, "jobs/a/input.onnx", BIG)
    assert not storage.exists("jobs/a/input.onnx")  # nothing visible before the commit
    writer.commit()
    assert storage.exists("jobs/a/input.onnx")
    found = storage.open("jobs/a/input.onnx")
    assert found.size == len(BIG) and hashlib.sha256(b"".join(found.chunks)).digest() == hashlib.sha256(BIG).digest()
    storage.get_file("jobs/a/input.onnx", tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == BIG
    assert storage.read_bytes("jobs/a/input.onnx", len(BIG)) == BIG
    with pytest.raises(ObjectTooLarge):
        storage.read_bytes("jobs/a/input.onnx", len(BIG) - 1)


def test_a_small_write_and_an_aborted_one(storage):
    write_in_pieces(storage, "jobs/a/small", b"tiny").commit()
    assert storage.read_bytes("jobs/a/small", 100) == b"tiny"
    write_in_pieces(storage, "jobs/a/gone", BIG).abort()
    assert not storage.exists("jobs/a/gone") and storage.sweep_partial(0) == 0  # nothing left to sweep


def test_an_abandoned_write_is_swept(storage):
    write_in_pieces(storage, "jobs/a/abandoned", BIG)  # the API process died before commit or abort
    time.sleep(0.05)
    if storage.kind == "local":  # moto dates every multipart upload 2010-11-10, so it always looks old there
        assert storage.sweep_partial(3600) == 0
    assert storage.sweep_partial(0) == 1
    assert storage.sweep_partial(0) == 0 and not storage.exists("jobs/a/abandoned")


def test_files_and_bytes_in_and_out(storage, tmp_path):
    source = tmp_path / "model.onnx"
    source.write_bytes(b"model bytes")
    storage.put_file("jobs/b/attempt-1/model.onnx", source)
    storage.put_bytes("jobs/b/attempt-1/report.json", b"{}")
    assert storage.read_bytes("jobs/b/attempt-1/model.onnx", 100) == b"model bytes"
    assert storage.read_bytes("jobs/b/attempt-1/report.json", 100) == b"{}"
    local = storage.local_path("jobs/b/attempt-1/model.onnx")
    assert (local is not None) is (storage.kind == "local")
    for read in (lambda k: storage.read_bytes(k, 10), storage.open, lambda k: storage.get_file(k, tmp_path / "x"),
                 lambda k: storage.copy(k, "jobs/c/x")):
        with pytest.raises(ObjectMissing):
            read("jobs/b/nothing")


def test_a_copy_outlives_its_source(storage):
    storage.put_bytes("jobs/src/attempt-1/model.onnx", b"artifact")
    storage.copy("jobs/src/attempt-1/model.onnx", "jobs/dst/attempt-0/model.onnx")
    assert storage.delete_prefix("jobs/src/") == 1
    assert not storage.exists("jobs/src/attempt-1/model.onnx")
    assert storage.read_bytes("jobs/dst/attempt-0/model.onnx", 100) == b"artifact"


def test_listing_and_deleting_by_prefix(storage):
    for key in ("jobs/j1/input.onnx", "jobs/j1/attempt-1/model.onnx", "jobs/j2/input.onnx", "jobs/j10/input.onnx"):
        storage.put_bytes(key, b"x")
    assert storage.children("jobs/") == ["j1", "j10", "j2"]
    assert storage.children("jobs/j1/") == ["attempt-1", "input.onnx"]
    assert abs(storage.newest_change("jobs/j1/") - time.time()) < 60 and storage.newest_change("jobs/none/") is None
    assert storage.delete_prefix("jobs/j1/") == 2  # j10 is not under j1/
    assert storage.children("jobs/") == ["j10", "j2"] and storage.delete_prefix("jobs/j1/") == 0


def test_a_presigned_url_downloads_the_object_where_the_store_has_them(storage):
    storage.put_bytes("jobs/p/attempt-1/model.onnx", b"signed bytes")
    url = storage.presign("jobs/p/attempt-1/model.onnx", "det.opt.onnx", 60)
    if storage.kind == "local":
        assert url is None
        return
    answer = httpx.get(url)
    assert answer.status_code == 200 and answer.content == b"signed bytes"
    assert 'filename="det.opt.onnx"' in answer.headers["content-disposition"]


@pytest.mark.parametrize("key", ["", "/etc/passwd", "jobs/../secret", "jobs//x", "jobs/./x"])
def test_keys_cannot_leave_the_store(storage, key):
    with pytest.raises(ValueError, match="bad storage key"):
        storage.put_bytes(key, b"x")


def test_the_store_answers_a_ping(storage):
    storage.ping()


def test_a_missing_bucket_fails_the_ping(s3_bucket, tmp_path):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError):
        open_storage(f"s3://{s3_bucket}-missing/x", tmp_path).ping()


def test_a_storage_url_must_name_a_bucket(tmp_path):
    for url in ("s3://", "gs://bucket", "/some/dir"):
        with pytest.raises(ValueError, match="s3://bucket/prefix"):
            open_storage(url, tmp_path)
