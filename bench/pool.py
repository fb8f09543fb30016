"""Worker processes for the conformance and fuzz benches: one task at a time each, so a task that kills its
process (onnxruntime's SIGFPE, an out-of-memory kill) or hangs costs that task only, and the worker is
replaced.

The workers are forked: they inherit whatever the parent prepared (the collected test cases) and run
``run(task) -> dict`` on each task; the parent gets the dict back, or a ``crash`` / ``timeout`` dict made
by ``failed(task, kind, detail)`` when the worker died or took longer than ``timeout`` seconds.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator, Sequence

Task = Any


def _serve(connection, run: Callable[[Task], dict]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    while True:
        task = connection.recv()
        if task is None:
            return
        connection.send(run(task))


class Pool:
    def __init__(self, run: Callable[[Task], dict], failed: Callable[[Task, str, str], dict], jobs: int,
                 timeout: float):
        self.context = multiprocessing.get_context("fork")
        self.run_task, self.failed, self.timeout = run, failed, timeout
        self.workers = [self._start() for _ in range(max(1, jobs))]

    def _start(self) -> dict:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_serve, args=(child, self.run_task), daemon=True)
        process.start()
        child.close()
        return {"process": process, "connection": parent, "task": None, "since": 0.0}

    def map(self, tasks: Sequence[Task]) -> Iterator[dict]:
        """Each task's answer, in the order they finish."""
        pending = list(reversed(tasks))
        while pending or any(w["task"] is not None for w in self.workers):
            for worker in self.workers:
                if worker["task"] is None and pending:
                    worker["task"], worker["since"] = pending.pop(), time.monotonic()
                    worker["connection"].send(worker["task"])
            busy = [w for w in self.workers if w["task"] is not None]
            ready = wait([w["connection"] for w in busy], timeout=1.0)
            for k, worker in enumerate(self.workers):
                task = worker["task"]
                if task is None:
                    continue
                if worker["connection"] in ready:
                    try:
                        answer = worker["connection"].recv()
                    except EOFError:
                        code = worker["process"].exitcode
                        self._replace(k)
                        yield self.failed(task, "crash", f"the worker process died (exit code {code})")
                        continue
                    worker["task"] = None
                    yield answer
                elif time.monotonic() - worker["since"] > self.timeout:
                    self._replace(k)
                    yield self.failed(task, "timeout", f"no answer within {self.timeout:.0f} s")

    def _replace(self, k: int) -> None:
        worker = self.workers[k]
        if worker["process"].is_alive():
            worker["process"].kill()
        worker["process"].join()
        self.workers[k] = self._start()

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker["connection"].send(None)
            except OSError:
                pass
            worker["process"].join(timeout=10)
            if worker["process"].is_alive():
                worker["process"].kill()
                worker["process"].join()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
