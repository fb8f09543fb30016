"""The asynchronous client: the same behaviour as the synchronous one, awaited (asyncio)."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from app.client import AsyncClient, Client, InvalidRequest, JobFailed, RetryPolicy
from tests.client.conftest import MODEL_BYTES

FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)


class AsyncFaults(httpx.AsyncBaseTransport):
    """A real transport that loses the answer of chosen requests and breaks a chosen download once."""

    def __init__(self):
        self.real = httpx.AsyncHTTPTransport()
        self.after: list[str] = []
        self.cut: dict[str, int] = {}
        self.sent: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = await self.real.handle_async_request(request)
        key = f"{request.method} {request.url.path}"
        if key in self.after:
            self.after.remove(key)
            await response.aread()
            raise httpx.ReadError("scripted: connection reset", request=request)
        if request.url.path in self.cut:
            body = await response.aread()
            limit = self.cut.pop(request.url.path)
            return httpx.Response(response.status_code, headers=response.headers,
                                  stream=_Broken(body[:limit]), request=request)
        return response

    async def aclose(self) -> None:
        await self.real.aclose()


class _Broken(httpx.AsyncByteStream):
    def __init__(self, head: bytes):
        self.head = head

    async def __aiter__(self):
        yield self.head
        raise httpx.ReadError("scripted: connection reset mid-body")


def test_submit_wait_and_a_download_that_resumes(service, model_file, tmp_path):
    faults = AsyncFaults()

    async def scenario():
        calls = []

        async def progress(job):  # a coroutine function is awaited
            calls.append(job.status)

        async with AsyncClient(service.url, retry=FAST, transport=faults) as client:
            before = (await client.list_jobs(limit=1))["total"]
            faults.after.append("POST /optimize")
            job = await client.submit(model_file, ["x86/fp32/nchw"], input_shapes={"x": [1, 3, 8, 8]})
            assert (await client.list_jobs(limit=1))["total"] == before + 1  # the retry made no second job
            await job.wait(progress, poll_interval=0.05)
            assert job.status == "succeeded" and calls[-1] == "succeeded"
            faults.cut[f"/jobs/{job.id}/artifact"] = 20_000
            out = await job.download(tmp_path / "out.onnx")
            assert out.read_bytes() == MODEL_BYTES
            ranges = [r.headers.get("range") for r in faults.sent if r.url.path.endswith("/artifact")]
            assert ranges == [None, "bytes=20000-"]
            assert [t["pass"] for t in await job.trace()] == ["fake_pass_1", "fake_pass_2", "fake_pass_3"]
            assert (await job.report())["verification"]["passed"] is True
            ids = [j.id async for j in client.iter_jobs(page_size=1)]
            assert job.id in ids

    asyncio.run(scenario())


def test_the_archive_download_resumes_after_a_break(service, model_file, tmp_path):
    import io
    import tarfile

    faults = AsyncFaults()

    async def scenario():
        async with AsyncClient(service.url, retry=FAST, transport=faults) as client:
            job = await (await client.submit(model_file)).wait(poll_interval=0.05)
            path = f"/jobs/{job.id}/artifact/archive"
            faults.cut[path] = 30_000
            out = await job.download(tmp_path / "out.tar", archive=True)
            ranges = [r.headers.get("range") for r in faults.sent if r.url.path == path]
            assert ranges == [None, "bytes=30000-"]
            with tarfile.open(fileobj=io.BytesIO(out.read_bytes())) as unpacked:
                assert [unpacked.extractfile(m).read() for m in unpacked.getmembers()] == [MODEL_BYTES]

    asyncio.run(scenario())


def test_problems_and_failed_jobs_raise_the_same_errors(service, model_file):
    with Client(service.url) as sync_client, service.scripted(sync_client, model_file, then="fail") as failing:
        pass

    async def scenario():
        async with AsyncClient(service.url, retry=FAST) as client:
            with pytest.raises(InvalidRequest) as bad:
                await client.submit(model_file, "x86/fp99/nchw")
            assert bad.value.field == "places" and bad.value.status == 422
            job = await client.job(failing.id)
            with pytest.raises(JobFailed, match=r"failed: ModelError: the file is not an ONNX model"):
                await job.wait(poll_interval=0.05)
            assert job.error["field"] == "model"

    asyncio.run(scenario())
