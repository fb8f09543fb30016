"""The worker command: ``python -m worker.jobs`` and ``mirserve worker`` (which adds the engine's options).

A worker runs until SIGTERM or SIGINT; settings come from ``MIRSERVE_*`` environment variables, which the
options below override.
"""
from __future__ import annotations

import argparse
import signal
import sys
from typing import Sequence


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="overrides MIRSERVE_DATA_DIR")
    parser.add_argument("--concurrency", type=int, help="overrides MIRSERVE_WORKER_CONCURRENCY")
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)


def run_worker(args: argparse.Namespace) -> int:
    """Run a worker with the settings of the environment and ``args``; returns the exit status."""
    from worker.jobs.config import JobSettings, load_settings  # pydantic-settings: not for `mirserve --help`
    from worker.jobs.consumer import JobWorker
    from worker.jobs.logs import configure_logging
    from worker.jobs.schema import SchemaError

    settings = load_settings(JobSettings, {"MIRSERVE_DATA_DIR": args.data_dir,
                                           "MIRSERVE_WORKER_CONCURRENCY": args.concurrency})
    configure_logging(settings.log_level, settings.log_format)
    if args.parent_pid:
        _stop_with_parent(args.parent_pid)
    try:
        worker = JobWorker(settings)
    except SchemaError as error:
        raise SystemExit(f"mirserve: error: {error}") from None
    worker.run()
    return 0


def _stop_with_parent(parent_pid: int) -> None:
    """An embedded worker gets SIGTERM (a clean stop) when the serving process dies, however it dies."""
    from worker.engine.api import die_with_parent

    if not die_with_parent(parent_pid, signal.SIGTERM):
        raise SystemExit("the serving process is gone; not starting a worker")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.jobs", description="Run a mirserve worker: it takes "
                                     "jobs from the queue and runs each in an engine process. Settings come from "
                                     "MIRSERVE_* environment variables (see the README).")
    add_worker_arguments(parser)
    return run_worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
