"""A worker process: huey consumer threads running jobs, plus a heartbeat and a reaper thread.

``JobWorker.run()`` is what ``mirserve worker`` runs in its main thread (SIGTERM/SIGINT stop it cleanly:
running engine children are killed and their jobs go back to the queue). ``start()``/``stop()`` embed a
worker in another process, as tests do.
"""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import threading

from huey.consumer import Consumer

from worker.jobs.config import JobSettings
from worker.jobs import engine_process
from worker.jobs.files import JobFiles
from worker.jobs.storage import open_storage
from worker.jobs.queue import JobQueue
from worker.jobs.reaper import Reaper
from worker.jobs.runner import JobRunner
from worker.jobs.store import JobStore

log = logging.getLogger("mirserve.worker")


class _EmbeddedConsumer(Consumer):
    """huey's consumer without its signal handlers: the worker decides how to stop."""

    def _set_signal_handlers(self):
        pass


class JobWorker:
    def __init__(self, config: JobSettings, *, store: JobStore | None = None, huey=None):
        self.config = config
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.store = store or JobStore(config.effective_database_url)
        self.store.check_schema()
        self.files = JobFiles(open_storage(config.storage_url, config.data_dir),
                              scratch=config.scratch_root / self.id)
        self.queue = JobQueue(huey) if huey is not None else JobQueue.connect(config)
        self.runner = JobRunner(self.store, self.files, config, self.id, enqueue=self.queue.enqueue)
        self.queue.handler = self.runner.run
        self.reaper = Reaper(self.store, self.files, self.queue, config)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._consumer: Consumer | None = None
        self.notifier = None
        if config.callback_hosts and config.callback_secret is not None:
            from worker.jobs.callbacks import Notifier

            self.notifier = Notifier(self.store, config.callback_secret.get_secret_value())

    def start(self) -> None:
        engine_process.prepare(self.config.engine, warm=self.config.warm_engines)
        self._beat()
        self._consumer = _EmbeddedConsumer(
            self.queue.huey, workers=self.config.worker_concurrency, periodic=False, initial_delay=0.05,
            backoff=1.5, max_delay=self.config.poll_seconds * 4, check_worker_health=True)
        self._consumer.start()
        for name, interval, step in (("heartbeat", self.config.heartbeat_seconds, self._beat),
                                     ("reaper", self.config.reaper_interval_seconds, self._reap)):
            thread = threading.Thread(target=self._every, args=(interval, step), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.notifier is not None:
            self.notifier.start()
        log.info("worker %s started: %d job thread(s), %s queue", self.id, self.config.worker_concurrency,
                 self.queue.backend)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking jobs, abort running ones (they are requeued), and leave the worker table."""
        self._stop.set()
        if self._consumer is not None:
            self._consumer.stop_flag.set()
        self.runner.stop()
        if self._consumer is not None:
            self._consumer.shutdown_timeout = timeout
            self._consumer.stop(graceful=True)
        for thread in self._threads:
            thread.join(timeout)
        if self.notifier is not None:
            self.notifier.stop(timeout)
        try:
            self.store.worker_gone(self.id)
        except Exception:  # noqa: BLE001 - the database may be what is going away
            log.exception("could not remove worker %s from the worker table", self.id)
        shutil.rmtree(self.files.scratch, ignore_errors=True)
        self.files.storage.close()
        log.info("worker %s stopped", self.id)

    def run(self) -> None:
        """Run until SIGTERM or SIGINT (call from the main thread)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self._stop.set())
        self.start()
        while not self._stop.wait(1.0):
            self._consumer.check_worker_health()
        self.stop()

    def _every(self, interval: float, step) -> None:
        while not self._stop.wait(interval):
            try:
                step()
            except Exception:  # noqa: BLE001 - a failed round must not end the loop
                log.exception("%s failed", threading.current_thread().name)

    def _beat(self) -> None:
        self.store.worker_beat(self.id, hostname=socket.gethostname(), pid=os.getpid(),
                               concurrency=self.config.worker_concurrency, running=self.runner.running)

    def _reap(self) -> None:
        report = self.reaper.run_once()
        if report.requeued or report.failed or report.resent or report.purged:
            log.info("reaper: requeued %s, failed %s, resent %s, purged %d", report.requeued, report.failed,
                     report.resent, len(report.purged))
