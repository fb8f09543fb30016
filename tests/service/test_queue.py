"""The queue's contract, run on SqliteHuey and on RedisHuey against the local server (the ``queue`` fixture)."""
from __future__ import annotations

import pickle

import pytest
from huey.registry import Message

from worker.jobs.queue import JobQueue, JsonMessageSerializer


def test_messages_come_out_in_order_and_once(queue):
    for job_id in ("a", "b", "c"):
        queue.enqueue(job_id)
    assert queue.pending() == 3
    assert [queue.take() for _ in range(4)] == ["a", "b", "c", None]
    assert queue.pending() == 0


def test_handler_runs_the_job_of_each_message(queue):
    ran = []
    queue.handler = ran.append
    queue.enqueue("job-1")
    task = queue.huey.dequeue()
    queue.huey.execute(task)
    assert ran == ["job-1"]


def test_a_queue_without_handler_refuses_to_run_jobs(queue):
    queue.enqueue("job-1")
    task = queue.huey.dequeue()
    with pytest.raises(RuntimeError, match="no job handler"):
        task.execute()


def test_producer_and_consumer_instances_share_messages(queue):
    """The API and a worker build their own huey objects from the same settings."""
    other = JobQueue(queue.huey.__class__(name=queue.huey.name, **_storage_kwargs(queue)))
    try:
        other.enqueue("from-the-api")
        assert queue.take() == "from-the-api"
    finally:
        other.close()


def test_ping_answers(queue):
    queue.ping()


def test_messages_are_json_and_pickles_are_refused():
    serializer = JsonMessageSerializer()
    message = Message("id-1", "worker.jobs.queue.run_job", None, 0, 0, None, ("job-1",), {}, None, None,
                      None, None, None, None, 0)
    data = serializer.serialize(message)
    assert data.startswith(b"{") and serializer.deserialize(data) == message
    with pytest.raises(ValueError):
        serializer.deserialize(pickle.dumps(message))


def _storage_kwargs(queue: JobQueue) -> dict:
    storage = queue.huey.storage
    if queue.backend == "redis":
        return {"connection_pool": storage.pool, "results": False, "serializer": JsonMessageSerializer()}
    return {"filename": storage.filename, "results": False, "serializer": JsonMessageSerializer()}
