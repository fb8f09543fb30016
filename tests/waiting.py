"""Waiting for something another thread or process does: one polling loop for every test that waits."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

#: Seconds between two looks. Short, because a test waits on average half of it past the moment the thing
#: happened; every look here is a cheap read (a row, a file, a local HTTP GET).
INTERVAL = 0.01


def wait_until(predicate: Callable[[], T], timeout: float, what: str, details: Callable[[], str] | None = None,
               interval: float = INTERVAL) -> T:
    """Call ``predicate`` until it returns something true and return that; after ``timeout`` seconds fail
    saying ``what`` was awaited, followed by ``details()`` (a log tail, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}"
                                 + (f":\n{details()}" if details else ""))
        time.sleep(interval)
