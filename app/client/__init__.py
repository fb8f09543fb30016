"""The Python client of a mirserve service: httpx only, synchronous (``Client``) and asynchronous
(``AsyncClient``), with the same methods.

```python
from app.client import Client

with Client("http://127.0.0.1:8000") as client:          # or MIRSERVE_SERVER; token= or MIRSERVE_TOKEN
    job = client.submit("model.onnx", places="arm/fp16/nhwc,arm/fp32/nchw",
                        input_shapes={"x": [1, 3, 640, 640]})
    job.wait(progress=lambda job: print(job.status, job.progress))
    job.download("model.opt.onnx")                         # streamed, sha256- and ETag-checked, resumable
    print(job.summary["nodes_before"], "->", job.summary["nodes_after"])
```

Errors the service answers are typed exceptions carrying the problem document (``InvalidRequest`` with
``field``, ``NotFound``, ``Conflict``, ...); a failed job raises ``JobFailed`` from ``wait()``. Connection
errors and 429/502/503/504 answers are retried with backoff; submissions carry an Idempotency-Key, so a
retried upload never makes two jobs.
"""
from app.client.aio import AsyncClient, AsyncJob
from app.client.errors import (BadRequest, Conflict, ConnectionFailed, Forbidden, IntegrityError, InvalidRequest,
                               JobCanceled, JobFailed, MirserveClientError, NotFound, PayloadTooLarge,
                               ProblemError, RateLimited, ServerError, ServiceUnavailable, Unauthorized,
                               UnsupportedMediaType, WaitTimeout)
from app.client.protocol import RetryPolicy
from app.client.sync import Client, Job

__all__ = ["AsyncClient", "AsyncJob", "BadRequest", "Client", "Conflict", "ConnectionFailed", "Forbidden",
           "IntegrityError", "InvalidRequest", "Job", "JobCanceled", "JobFailed", "MirserveClientError",
           "NotFound", "PayloadTooLarge", "ProblemError", "RateLimited", "RetryPolicy", "ServerError",
           "ServiceUnavailable", "Unauthorized", "UnsupportedMediaType", "WaitTimeout"]
