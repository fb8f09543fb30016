"""The queue: huey carrying "run job X" messages, on SQLite by default and on Redis when configured.

A message is only a wake-up. huey delivers at most once (a worker killed after taking a message loses it), so
the job table decides what runs: a message for a job that is no longer queued does nothing, and the reaper
re-sends messages for jobs that wait too long. Messages are JSON, not huey's default pickle, so that whoever
can write to the Redis server still cannot make a worker run code.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from huey import Huey, RedisHuey, SqliteHuey
from huey.registry import Message
from huey.serializer import Serializer
from huey.storage import SqliteStorage

from worker.jobs.config import JobSettings

TASK_NAME = "run_job"


class JsonMessageSerializer(Serializer):
    """Serialize huey messages as JSON; refuses anything but plain values (our messages carry a job id)."""

    def _serialize(self, data: Message) -> bytes:
        return json.dumps(data._asdict()).encode()

    def _deserialize(self, data: bytes) -> Message:
        fields = json.loads(data)
        fields["args"] = tuple(fields.get("args") or ())
        return Message(**fields)


class WalSqliteStorage(SqliteStorage):
    """huey's SQLite storage with ``synchronous=NORMAL``: in WAL mode a commit then needs no fsync (2.5 ms
    each here), and power loss can only drop the newest messages, which the reaper sends again."""

    def _create_connection(self):
        conn = super()._create_connection()
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn


def build_huey(config: JobSettings) -> Huey:
    common = dict(name=config.queue_name, results=False, utc=True, serializer=JsonMessageSerializer())
    if config.redis_url:
        return RedisHuey(url=config.redis_url, blocking=True, read_timeout=config.queue_wait_seconds, **common)
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    return SqliteHuey(filename=str(Path(config.data_dir) / "queue.db"), timeout=10, storage_class=WalSqliteStorage,
                      **common)


class JobQueue:
    """Enqueue job ids; a worker passes ``handler`` to have its consumer threads run them."""

    def __init__(self, huey: Huey, handler: Callable[[str], None] | None = None):
        self.huey = huey
        self.handler = handler
        self._task = huey.task(name=TASK_NAME, retries=0)(self._run)

    @classmethod
    def connect(cls, settings: JobSettings) -> "JobQueue":
        """The queue the settings name (Redis, or SQLite in the data directory)."""
        return cls(build_huey(settings))

    @property
    def backend(self) -> str:
        return "redis" if isinstance(self.huey, RedisHuey) else "sqlite"

    def _run(self, job_id: str) -> None:
        if self.handler is None:
            raise RuntimeError("this queue has no job handler: it belongs to an API process, not a worker")
        self.handler(job_id)

    def enqueue(self, job_id: str) -> None:
        self._task(job_id)

    def pending(self) -> int:
        return self.huey.pending_count()

    def ping(self) -> None:
        """Raise when the queue's storage cannot be reached."""
        self.huey.pending_count()

    def take(self) -> str | None:
        """Pop one job id without running it (tests and tools; workers use the consumer)."""
        task = self.huey.dequeue()
        return task.args[0] if task is not None else None

    def flush(self) -> None:
        self.huey.flush()

    def close(self) -> None:
        close = getattr(self.huey.storage, "close", None)
        if close is not None:
            close()
