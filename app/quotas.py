"""Each owner's share of the service: unfinished jobs, stored bytes, and uploads per minute (429 beyond).

Admins, and the local user of a service without keys, have no limits. Unfinished jobs and stored bytes are read
from the job table when a submission arrives, so they hold across API processes (submissions that race may
each pass, by one job); the upload rate is counted by this API process over a sliding minute, before the body
is read, refused attempts included, so that deleting jobs does not buy more uploads.
"""
from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from typing import Any, Callable

from app.errors import ServiceError

WINDOW_SECONDS = 60.0
#: What a client over its job limit is told to wait: about as long as a small job takes.
ACTIVE_JOBS_RETRY_SECONDS = 10
#: Over its storage, only deleting jobs (or retention) helps: ask again in a while.
STORED_BYTES_RETRY_SECONDS = 300


class QuotaExceeded(ServiceError):
    """A limit of the owner is reached; ``limit`` names it (a setting), answered as 429 with Retry-After."""

    def __init__(self, limit: str, detail: str, *, retry_after: int, maximum: float, current: float,
                 **extensions: Any):
        super().__init__("quota-exceeded", detail, limit=limit, maximum=maximum, current=current, **extensions)
        self.retry_after = retry_after


class UploadRate:
    """Submissions per owner over the last minute, in this process (a deque of times per owner)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self._times: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def admit(self, owner: str) -> None:
        """Count one submission of ``owner``, or raise QuotaExceeded when the minute is full."""
        if self.per_minute <= 0:
            return
        now = self.clock()
        with self._lock:
            times = self._times[owner]
            while times and times[0] <= now - WINDOW_SECONDS:
                times.popleft()
            if len(times) >= self.per_minute:
                wait = math.ceil(times[0] + WINDOW_SECONDS - now)
                raise QuotaExceeded("uploads_per_minute", f"at most {self.per_minute} submissions a minute per "
                                    f"owner; try again in {wait} s", retry_after=max(wait, 1),
                                    maximum=self.per_minute, current=len(times))
            times.append(now)


def check_active_jobs(owner: str, active: int, maximum: int) -> None:
    if maximum and active >= maximum:
        raise QuotaExceeded("active_jobs", f"you have {active} jobs queued or running, the most one owner may "
                            f"have; submit again when one has ended (or cancel one)",
                            retry_after=ACTIVE_JOBS_RETRY_SECONDS, maximum=maximum, current=active)


def check_stored_bytes(owner: str, stored: int, incoming: int, maximum: int) -> None:
    if maximum and stored + incoming > maximum:
        raise QuotaExceeded("stored_bytes", f"your jobs hold {stored} bytes of uploads and artifacts"
                            + (f" and this upload has {incoming}" if incoming else "")
                            + f", over the {maximum} bytes one owner may keep; delete jobs you no longer need",
                            retry_after=STORED_BYTES_RETRY_SECONDS, maximum=maximum, current=stored + incoming)
