"""A worker process: huey consumer threads running jobs, plus a heartbeat and a reaper thread.

``JobWorker.run()`` is what ``mirserve worker`` runs in its main thread. SIGTERM or SIGINT drains it: it
claims no more jobs, lets the running ones finish for up to ``MIRSERVE_SHUTDOWN_GRACE_SECONDS``, then kills
the engine processes still running and releases their leases, so their jobs are queued again at once for
another worker (a second signal ends the wait). ``start()``/``stop()`` embed a worker in another process, as
tests do.
"""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import threading
import time

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

#: The longest pause of an idle worker thread between two looks at a queue it must poll (SQLite; Redis blocks
#: on the queue instead): a job submitted to an idle service waits at most this long for a worker. A look reads
#: one small table, so ten a second cost nothing worth saving. Busy, the threads look again at once.
IDLE_POLL_SECONDS = 0.1
#: How often ``run()``'s main thread looks at the stop signals it has received (its handler only counts them).
SIGNAL_LOOK_SECONDS = 0.05


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
        self._stop = threading.Event()  # ends the heartbeat and reaper threads
        self._signals = 0  # SIGTERM/SIGINT received by run(): the first drains, a second ends the drain
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
            backoff=1.5, max_delay=IDLE_POLL_SECONDS, check_worker_health=True)
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

    def stop(self, timeout: float = 10.0, grace: float = 0.0) -> None:
        """Stop taking jobs, give running ones ``grace`` seconds to finish, abort the rest (their leases are
        released: the jobs are queued again at once), and leave the worker table."""
        self.runner.drain()
        if self._consumer is not None:
            self._consumer.stop_flag.set()
        self._drain(grace)
        self._stop.set()
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

    def _drain(self, grace: float) -> None:
        running = self.runner.running
        if grace <= 0 or not running:
            return
        log.info("worker %s draining: %d running job(s) may finish within %g s", self.id, running, grace)
        deadline = time.monotonic() + grace
        while self.runner.running and time.monotonic() < deadline and self._signals < 2:
            time.sleep(SIGNAL_LOOK_SECONDS)
        if self.runner.running:
            log.warning("worker %s: %d job(s) still running after the grace period; releasing them", self.id,
                        self.runner.running)

    def run(self) -> None:
        """Run until SIGTERM or SIGINT (call from the main thread), then drain with the configured grace."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        self.start()
        health_checked = time.monotonic()
        while not self._signals:
            time.sleep(SIGNAL_LOOK_SECONDS)
            if time.monotonic() - health_checked >= 1.0:
                self._consumer.check_worker_health()
                health_checked = time.monotonic()
        self.stop(timeout=10.0, grace=self.config.shutdown_grace_seconds)

    def on_signal(self, signum: int, frame) -> None:
        """``run()``'s handler of SIGTERM and SIGINT: it counts them and does nothing else. A handler runs in
        the main thread between two of its bytecodes, maybe inside a lock's critical section (an
        ``Event.wait()``'s, say), so it must take no lock: one that called ``Event.set()`` on the event the
        main thread waited on hung a worker for good on its stop signal (CPython issue 126434)."""
        self._signals += 1

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
