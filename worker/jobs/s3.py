"""Storage on any S3-compatible store (AWS S3, MinIO, Ceph), through boto3.

``MIRSERVE_STORAGE_URL=s3://bucket/prefix`` names the bucket and a key prefix; everything else comes from
the standard AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_S3`` for a store other than AWS), as for any AWS tool. With an
endpoint set, keys are addressed by path (``endpoint/bucket/key``), which MinIO and the others expect.

Uploads are multipart (parts of 8 MiB, the size boto3's transfers use), so an upload of any size is held in
memory one part at a time; an upload abandoned by a dying API process is aborted by the reaper's sweep.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlparse

from worker.jobs.storage import ObjectMissing, ObjectTooLarge, ObjectWriter, Storage, StoredObject

PART_BYTES = 8 << 20
STREAM_CHUNK = 1 << 20


class S3Storage(Storage):
    kind = "s3"

    def __init__(self, bucket: str, prefix: str = "", client=None):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        config = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32,
                        s3={"addressing_style": "path"} if endpoint else None)
        self.client = client or boto3.client("s3", config=config)
        self.transfer = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES)

    @classmethod
    def from_url(cls, url: str) -> "S3Storage":
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"an S3 storage URL looks like s3://bucket/prefix, not {url!r}")
        return cls(parsed.netloc, parsed.path)

    def key(self, key: str) -> str:
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
            raise ValueError(f"bad storage key {key!r}")
        return self.prefix + key

    def writer(self, key: str) -> ObjectWriter:
        return _MultipartWriter(self, self.key(key))

    def put_file(self, key: str, path: Path) -> None:
        self.client.upload_file(str(path), self.bucket, self.key(key), Config=self.transfer)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(key), Body=data)

    def get_file(self, key: str, path: Path) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.download_file(self.bucket, self.key(key), str(path), Config=self.transfer)
        except ClientError as error:
            raise _missing(error, key)

    def read_bytes(self, key: str, limit: int) -> bytes:
        found = self.open(key)
        if found.size > limit:
            raise ObjectTooLarge(f"{key} is larger than {limit} bytes")
        return b"".join(found.chunks)

    def open(self, key: str, start: int = 0) -> StoredObject:
        from botocore.exceptions import ClientError

        ranged = {"Range": f"bytes={start}-"} if start else {}
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key(key), **ranged)
        except ClientError as error:
            raise _missing(error, key)
        body = answer["Body"]
        if start:  # Content-Range: bytes START-END/SIZE
            return StoredObject(int(answer["ContentRange"].rpartition("/")[2]), _body_chunks(body))

        return StoredObject(int(answer["ContentLength"]), _body_chunks(body))

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(key))
        except ClientError as error:
            if _status(error) == 404:
                return False
            raise
        return True

    def copy(self, source: str, target: str) -> None:
        from botocore.exceptions import ClientError

        try:  # server-side; boto3's managed copy goes multipart above 5 GB
            self.client.copy({"Bucket": self.bucket, "Key": self.key(source)}, self.bucket, self.key(target),
                             Config=self.transfer)
        except ClientError as error:
            raise _missing(error, source)

    def delete_prefix(self, prefix: str) -> int:
        deleted = 0
        for page in self._pages(prefix):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
                deleted += len(keys)
        return deleted

    def children(self, prefix: str) -> list[str]:
        base = self.key(prefix.rstrip("/")) + "/"
        names = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base,
                                                                          Delimiter="/"):
            names += [p["Prefix"][len(base):].rstrip("/") for p in page.get("CommonPrefixes", [])]
            names += [item["Key"][len(base):] for item in page.get("Contents", [])]
        return sorted(names)

    def newest_change(self, prefix: str) -> float | None:
        times = [item["LastModified"].timestamp() for page in self._pages(prefix) for item in page.get("Contents", [])]
        return max(times) if times else None

    def sweep_partial(self, older_than_seconds: float) -> int:
        cutoff = time.time() - older_than_seconds
        aborted = 0
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for upload in page.get("Uploads", []):
                if upload["Initiated"].timestamp() < cutoff:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                       UploadId=upload["UploadId"])
                    aborted += 1
        return aborted

    def presign(self, key: str, filename: str, expires_seconds: int) -> str | None:
        return self.client.generate_presigned_url(
            "get_object", ExpiresIn=expires_seconds,
            Params={"Bucket": self.bucket, "Key": self.key(key),
                    "ResponseContentDisposition": f'attachment; filename="{filename}"'})

    def ping(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)

    def close(self) -> None:
        self.client.close()

    def _pages(self, prefix: str):
        return self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.key(
            prefix.rstrip("/")) + ("/" if prefix.endswith("/") else ""))


class _MultipartWriter(ObjectWriter):
    """Buffers one part; the first full part starts a multipart upload; a small object is one PUT."""

    def __init__(self, storage: S3Storage, key: str):
        self.storage, self.key = storage, key
        self.buffer = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict] = []

    def write(self, data: bytes) -> None:
        self.buffer += data

    @property
    def due(self) -> bool:
        return len(self.buffer) >= PART_BYTES

    def flush(self) -> None:
        client, bucket = self.storage.client, self.storage.bucket
        while len(self.buffer) >= PART_BYTES:
            if self.upload_id is None:
                self.upload_id = client.create_multipart_upload(Bucket=bucket, Key=self.key)["UploadId"]
            number = len(self.parts) + 1
            answer = client.upload_part(Bucket=bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number,
                                        Body=bytes(self.buffer[:PART_BYTES]))
            self.parts.append({"PartNumber": number, "ETag": answer["ETag"]})
            del self.buffer[:PART_BYTES]

    def commit(self) -> None:
        client, bucket = self.storage.client, self.storage.bucket
        if self.upload_id is None:
            client.put_object(Bucket=bucket, Key=self.key, Body=bytes(self.buffer))
            return
        if self.buffer:  # the last part may be smaller than the others
            number = len(self.parts) + 1
            answer = client.upload_part(Bucket=bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number,
                                        Body=bytes(self.buffer))
            self.parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        client.complete_multipart_upload(Bucket=bucket, Key=self.key, UploadId=self.upload_id,
                                         MultipartUpload={"Parts": self.parts})
        self.buffer.clear()

    def abort(self) -> None:
        self.buffer.clear()
        if self.upload_id is not None:
            self.storage.client.abort_multipart_upload(Bucket=self.storage.bucket, Key=self.key,
                                                       UploadId=self.upload_id)
            self.upload_id = None


def _status(error) -> int | None:
    return error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _missing(error, key: str) -> Exception:
    """A 404 becomes ObjectMissing; anything else is raised as it is."""
    if _status(error) == 404 or error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
        return ObjectMissing(key)
    return error


def _body_chunks(body):
    try:
        yield from body.iter_chunks(STREAM_CHUNK)
    finally:
        body.close()
