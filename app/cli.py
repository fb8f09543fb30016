"""The ``mirserve`` program: the engine's commands (``optimize``, ``passes``) plus the service's.

- ``mirserve serve``: the API and one embedded worker, in one process tree: the README's single command.
  The worker is a child process (a crashed or killed worker is restarted; it dies with the API).
- ``mirserve api`` / ``mirserve worker``: the two halves apart, to scale workers out.
- ``mirserve openapi``: print or write the OpenAPI document.

The engine's parser (``worker.cli.build_parser``) is extended here because the engine never imports the
service.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from worker.cli import add_plugin_argument, build_parser
from worker.process import die_with_parent
from worker.cli import main as engine_main

log = logging.getLogger("mirserve.serve")
RESTART_DELAY_SECONDS = 1.0
WORKER_STOP_SECONDS = 15.0


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    add_service_commands(commands)
    return engine_main(argv, parser)


def add_service_commands(commands) -> None:
    for name, func, text in (("serve", run_serve, "run the API and one embedded worker (the usual way)"),
                             ("api", run_api, "run only the HTTP API"),
                             ("worker", run_worker, "run only a worker")):
        cmd = commands.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}; settings come "
                                  "from MIRSERVE_* environment variables (see the README).")
        cmd.add_argument("--data-dir", help="overrides MIRSERVE_DATA_DIR")
        if name != "worker":
            cmd.add_argument("--host", help="overrides MIRSERVE_HOST")
            cmd.add_argument("--port", type=int, help="overrides MIRSERVE_PORT")
        else:
            cmd.add_argument("--concurrency", type=int, help="overrides MIRSERVE_WORKER_CONCURRENCY")
            cmd.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
        add_plugin_argument(cmd)
        cmd.set_defaults(func=func)
    cmd = commands.add_parser("openapi", help="print the service's OpenAPI document")
    cmd.add_argument("-o", "--output", help="write it to this file instead")
    cmd.set_defaults(func=run_openapi)


def _settings(args: argparse.Namespace):
    """Settings from the environment; command-line overrides go into the environment so children see them."""
    overrides = {"MIRSERVE_DATA_DIR": getattr(args, "data_dir", None), "MIRSERVE_HOST": getattr(args, "host", None),
                 "MIRSERVE_PORT": getattr(args, "port", None),
                 "MIRSERVE_WORKER_CONCURRENCY": getattr(args, "concurrency", None)}
    for key, value in overrides.items():
        if value is not None:
            os.environ[key] = str(value)
    from pydantic import ValidationError

    from app.settings import Settings

    try:
        settings = Settings()
    except ValidationError as error:
        problems = "; ".join(f"{'MIRSERVE_' + str(e['loc'][0]).upper() + ': ' if e['loc'] else ''}{e['msg']}"
                             for e in error.errors())
        raise SystemExit(f"mirserve: error: invalid settings: {problems}") from None
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return settings


def run_api(args: argparse.Namespace) -> int:
    return _serve_api(_settings(args))


def _serve_api(settings) -> int:
    import uvicorn

    from app.main import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                access_log=settings.log_level == "debug")
    return 0


def run_worker(args: argparse.Namespace) -> int:
    from worker.jobs.consumer import JobWorker

    settings = _settings(args)
    if args.parent_pid:
        _stop_with_parent(args.parent_pid)
    JobWorker(settings.job_config).run()
    return 0


def run_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)  # bad settings stop here, before anything starts
    supervisor = WorkerSupervisor([sys.executable, "-m", "app.cli", "worker", "--parent-pid", str(os.getpid())])
    supervisor.start()
    try:
        return _serve_api(settings)
    finally:
        supervisor.stop()


def run_openapi(args: argparse.Namespace) -> int:
    import tempfile

    from app.main import create_app
    from app.openapi import render
    from app.settings import Settings

    with tempfile.TemporaryDirectory() as data_dir:  # the document does not depend on the data
        app = create_app(Settings(data_dir=Path(data_dir), redis_url=None, database_url=None))
        text = render(app)
        app.state.services.close()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


class WorkerSupervisor:
    """Keeps one worker process running beside the API; restarts it when it dies, stops it on exit."""

    def __init__(self, command: list[str]):
        self.command = command
        self.process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        self.process = subprocess.Popen(self.command, env=_child_env())
        log.info("started worker process %d", self.process.pid)

    def _watch(self) -> None:
        while not self._stopping.is_set():
            code = self.process.poll()
            if code is not None and not self._stopping.is_set():
                log.warning("worker process %d exited (%s); restarting it", self.process.pid, code)
                if self._stopping.wait(RESTART_DELAY_SECONDS):
                    return
                self._spawn()
            self._stopping.wait(0.5)

    def stop(self) -> None:
        self._stopping.set()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(WORKER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _child_env() -> dict[str, str]:
    """The worker must import this checkout even when mirserve is not installed (e.g. ``python -m app.cli``)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _stop_with_parent(parent_pid: int) -> None:
    """An embedded worker gets SIGTERM (a clean stop) when the serving process dies, however it dies."""
    if not die_with_parent(parent_pid, signal.SIGTERM):
        raise SystemExit("the serving process is gone; not starting a worker")


if __name__ == "__main__":
    sys.exit(main())
