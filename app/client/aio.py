"""The asynchronous client: ``AsyncClient`` and the ``AsyncJob`` it returns (the same API as ``Client``,
awaited; it runs on asyncio, or on trio through anyio)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import anyio  # httpx's own async layer
import httpx

from app.client.errors import ConnectionFailed, Conflict, IntegrityError, JobCanceled, JobFailed, WaitTimeout
from app.client.protocol import (RETRY_STATUSES, Download, JobFields, RetryPolicy, auth_headers,
                                 content_disposition_name, new_idempotency_key, raise_for_problem, retry_after,
                                 server_url, submit_fields)

Progress = Callable[["AsyncJob"], Any]


class AsyncClient:
    """A mirserve service over HTTP, for async code.

    ``server`` defaults to MIRSERVE_SERVER, then http://127.0.0.1:8000; ``token`` (sent as a bearer token) to
    MIRSERVE_TOKEN. Connection errors and 429/502/503/504 answers are retried with backoff (``retry``).
    Use it as an async context manager, or await ``close()``.
    """

    def __init__(self, server: str | None = None, *, token: str | None = None, timeout: float = 60.0,
                 retry: RetryPolicy = RetryPolicy(), transport: httpx.AsyncBaseTransport | None = None):
        self.server = server_url(server)
        self.retry = retry
        self._http = httpx.AsyncClient(base_url=self.server, headers=auth_headers(token), transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    # --- one request, retried ----------------------------------------------------------------------------
    async def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        """Send a request (retrying what is worth retrying); raise the typed error of an error answer."""
        response = await self._send(lambda: self._http.request(method, url, **kwargs))
        raise_for_problem(response)
        return response

    async def _send(self, attempt_once: Callable[[], Any]) -> httpx.Response:
        for attempt in range(1, self.retry.attempts + 1):
            try:
                response = await attempt_once()
            except httpx.TransportError as error:
                if attempt == self.retry.attempts:
                    raise ConnectionFailed(f"cannot reach {self.server}: {type(error).__name__}: {error}") from error
                await anyio.sleep(self.retry.delay(attempt))
                continue
            if response.status_code not in RETRY_STATUSES or attempt == self.retry.attempts:
                return response
            await response.aclose()
            await anyio.sleep(self.retry.delay(attempt, retry_after(response)))
        raise AssertionError("unreachable")

    # --- jobs --------------------------------------------------------------------------------------------
    async def submit(self, model: str | Path, places: str | list[str] | None = None, *,
               idempotency_key: str | None = None, callback_url: str | None = None, **options: Any) -> "AsyncJob":
        """Upload a model with its places (priority order) and engine options (``input_shapes={"x": [1, 3,
        224, 224]}``, ``opt_level``, ``cut_end``, ... as for ``mirserve optimize``); returns the queued job.

        Every try of the upload carries the same Idempotency-Key, so a retried submission never makes two jobs.
        With ``callback_url``, the service POSTs a signed notice there when the job ends.
        """
        path = Path(model)
        fields = submit_fields(places, options)
        if callback_url:
            fields["callback_url"] = callback_url
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}

        async def once() -> httpx.Response:
            with open(path, "rb") as stream:  # reopened per try: a retry sends the whole file again
                return await self._http.post("/optimize", data=fields, headers=headers,
                                             files={"model": (path.name, stream, "application/octet-stream")})

        response = await self._send(once)
        raise_for_problem(response)
        return AsyncJob(self, response.json())

    async def job(self, job_id: str) -> "AsyncJob":
        return AsyncJob(self, (await self.request("GET", f"/jobs/{job_id}")).json())

    async def list_jobs(self, status: str | None = None, *, limit: int = 20, offset: int = 0) -> dict[str, Any]:
        """One page, newest first: ``{"items": [Job, ...], "total", "limit", "offset", "next_offset"}``."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        page = (await self.request("GET", "/jobs", params=params)).json()
        page["items"] = [AsyncJob(self, item) for item in page["items"]]
        return page

    async def iter_jobs(self, status: str | None = None, *, page_size: int = 100) -> AsyncIterator["AsyncJob"]:
        """Every job, newest first, page after page."""
        offset: int | None = 0
        while offset is not None:
            page = await self.list_jobs(status, limit=page_size, offset=offset)
            for item in page["items"]:
                yield item
            offset = page["next_offset"]

    async def cancel(self, job_id: str) -> "AsyncJob":
        """Cancel a queued or running job; a job that ended canceled meanwhile is returned as it is."""
        try:
            return AsyncJob(self, (await self.request("POST", f"/jobs/{job_id}/cancel")).json())
        except Conflict as conflict:
            if conflict.extensions.get("job_status") == "canceled":  # e.g. a retried cancel that had worked
                return await self.job(job_id)
            raise

    async def delete(self, job_id: str) -> None:
        await self.request("DELETE", f"/jobs/{job_id}")

    # --- the engine's catalogue and the service's health --------------------------------------------------
    async def passes(self) -> dict[str, Any]:
        return (await self.request("GET", "/passes")).json()

    async def targets(self, kernels: bool = True) -> list[dict[str, Any]]:
        return (await self.request("GET", "/targets", params={"kernels": str(kernels).lower()})).json()

    async def health(self) -> dict[str, Any]:
        return (await self.request("GET", "/healthz")).json()

    async def ready(self) -> dict[str, Any]:
        return (await self.request("GET", "/readyz")).json()


class AsyncJob(JobFields):
    """A job of the service; ``await refresh()`` reads it again, ``await wait()`` until it ends."""

    def __init__(self, client: AsyncClient, data: Mapping[str, Any]):
        self.client = client
        self.data = dict(data)

    async def refresh(self) -> "AsyncJob":
        self.data = (await self.client.request("GET", f"/jobs/{self.id}")).json()
        return self

    async def wait(self, progress: Progress | None = None, *, timeout: float | None = None,
             poll_interval: float | None = None, raise_on_failure: bool = True) -> "AsyncJob":
        """Poll until the job ends; ``progress(job)`` (a function or a coroutine function) is called whenever
        its status or pass changes.

        Polls as often as the service's Retry-After says (``poll_interval`` overrides it). Raises JobFailed
        or JobCanceled when it did not succeed (unless ``raise_on_failure`` is false), WaitTimeout when
        ``timeout`` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = None
        while True:
            response = await self.client.request("GET", f"/jobs/{self.id}")
            self.data = response.json()
            state = (self.status, (self.progress or {}).get("index"), (self.progress or {}).get("current_pass"))
            if progress is not None and state != seen:
                called = progress(self)
                if hasattr(called, "__await__"):
                    await called
            seen = state
            if self.is_finished:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(self, timeout)
            pause = poll_interval if poll_interval is not None else (retry_after(response) or 2.0)
            await anyio.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        if raise_on_failure and self.status == "failed":
            raise JobFailed(self)
        if raise_on_failure and self.status == "canceled":
            raise JobCanceled(self)
        return self

    async def cancel(self) -> "AsyncJob":
        self.data = (await self.client.cancel(self.id)).data
        return self

    async def delete(self) -> None:
        await self.client.delete(self.id)

    async def download(self, path: str | Path, *, archive: bool = False) -> Path:
        """Save the optimized model at ``path``: streamed, resumed with Range after a broken connection (or
        an earlier interrupted call), and checked against the job's sha256 and ETag before it is moved into
        place. A model over 2 GB also gets its weights file, beside it under the name the model refers to.
        With ``archive``, ``path`` gets one tar of the model and its external data instead (resumed with Range
        after a broken connection within the call)."""
        artifact = self.artifact or (await self.refresh()).artifact
        if artifact is None:
            raise Conflict(409, {"detail": f"job {self.id} is {self.status}; it has an artifact only once it has "
                                           f"succeeded", "job_status": self.status})
        if archive:
            url = artifact.get("archive_url") or artifact["url"] + "/archive"
            return await self._fetch(url, Download(Path(path), None, None, etag=f'"{artifact["sha256"]}.tar"'))
        download = Download(Path(path), artifact["sha256"], artifact["bytes"], etag=f'"{artifact["sha256"]}"')
        await self._fetch(artifact["url"], download)
        if artifact.get("data_url"):
            await self._fetch_data(artifact["data_url"], Path(path))
        return Path(path)

    async def _fetch(self, url: str, download: Download) -> Path:
        policy = self.client.retry
        for attempt in range(1, policy.attempts + 1):
            if download.complete:
                try:
                    return download.finish()
                except IntegrityError:
                    if attempt == policy.attempts:
                        raise
                    continue  # what an earlier run left was not this artifact: start over
            try:
                async with self.client._http.stream("GET", url, headers=download.headers()) as response:
                    if response.status_code in RETRY_STATUSES and attempt < policy.attempts:
                        await anyio.sleep(policy.delay(attempt, retry_after(response)))
                        continue
                    if response.status_code == 416:  # resumed past the end: the part file is not this one
                        download.restart()
                        continue
                    if response.status_code >= 400:
                        await response.aread()
                        raise_for_problem(response)
                    with download.begin(response) as out:
                        async for chunk in response.aiter_bytes():
                            download.write(out, chunk)
                if download.size is None:
                    download.size = download.received
            except httpx.TransportError as error:
                if attempt == policy.attempts:
                    raise ConnectionFailed(f"downloading {url} failed: {type(error).__name__}: {error}") from error
                await anyio.sleep(policy.delay(attempt))
        return download.finish()

    async def _fetch_data(self, url: str, model_path: Path) -> Path:
        async with self.client._http.stream("GET", url) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_problem(response)
            name = content_disposition_name(response, model_path.name + ".data")
            size = int(response.headers["content-length"]) if "content-length" in response.headers else None
            download = Download(model_path.parent / name, None, size)
            with download.begin(response) as out:
                async for chunk in response.aiter_bytes():
                    download.write(out, chunk)
        return download.finish()

    async def trace(self, format: str | None = None) -> Any:
        """The pass trace: a list of entries, or with ``format="chrome"`` a Chrome trace-event document."""
        params = {"format": format} if format else None
        return (await self.client.request("GET", f"/jobs/{self.id}/trace", params=params)).json()

    async def memory(self) -> dict[str, Any]:
        return (await self.client.request("GET", f"/jobs/{self.id}/memory")).json()

    async def memory_timeline_svg(self, space: str | None = None) -> str:
        params = {"space": space} if space else None
        return (await self.client.request("GET", f"/jobs/{self.id}/memory/timeline.svg", params=params)).text

    async def graph_svg(self) -> str:
        return (await self.client.request("GET", f"/jobs/{self.id}/graph.svg")).text

    async def report(self) -> dict[str, Any]:
        return (await self.client.request("GET", f"/jobs/{self.id}/report")).json()
