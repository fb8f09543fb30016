"""The remote commands of ``mirserve``: a service's jobs from the command line, through ``app.client``.

- ``mirserve submit MODEL [options as for optimize] [--wait] [-o OUT]``: upload, follow the passes with a
  progress bar (on a terminal; nothing when stderr is not one), download, and print the same summary as a
  local ``mirserve optimize``;
- ``mirserve jobs [--status S]``: the newest jobs as a table;
- ``mirserve job ID [--trace | --memory | --report] [-o OUT]``: one job, its summary, trace, memory or report;
- ``mirserve cancel ID``.

Each takes ``--server URL`` (default MIRSERVE_SERVER, else http://127.0.0.1:8000) and ``--token TOKEN``
(default MIRSERVE_TOKEN, sent as a bearer token). Errors print one line and exit 1.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

from app.client.errors import JobFailed, MirserveClientError, ProblemError
from app.client.sync import Client, Job

PROGRESS_POLL_SECONDS = 0.5


def add_remote_commands(commands) -> None:
    from worker.engine.api import add_option_arguments, add_output_arguments, add_picture_arguments

    cmd = commands.add_parser("submit", help="optimize a model on a mirserve service (remote optimize)",
                              description="Upload MODEL to a mirserve service with the same options as "
                                          "`mirserve optimize`. With --wait (or -o) follow its passes, download "
                                          "the optimized model and print the same summary as a local run.")
    cmd.add_argument("model", metavar="MODEL", help="the ONNX model to optimize, or a .zip, .tar or .tar.gz "
                                                    "holding one with its external data files")
    cmd.add_argument("-o", "--output", metavar="OUT", help="download the optimized model here (implies --wait); "
                                                           "OUT.tar: the model and its external data as one tar")
    cmd.add_argument("--wait", action="store_true", help="wait until the job ends")
    cmd.add_argument("--callback-url", metavar="URL", help="the service POSTs a signed notice here when the job "
                                                          "ends (its host must be one the service allows)")
    add_option_arguments(cmd, check_support=False)
    add_picture_arguments(cmd)
    add_output_arguments(cmd)
    _add_connection_arguments(cmd)
    cmd.set_defaults(func=run_submit)

    cmd = commands.add_parser("jobs", help="list a mirserve service's jobs, newest first")
    cmd.add_argument("--status", choices=("queued", "running", "succeeded", "failed", "canceled"))
    cmd.add_argument("--limit", type=int, default=20, help="how many (default: %(default)s, at most 100)")
    cmd.add_argument("--json", action="store_true", help="print the page as JSON")
    _add_connection_arguments(cmd)
    cmd.set_defaults(func=run_jobs)

    cmd = commands.add_parser("job", help="show one job of a mirserve service: status and summary, or its "
                                          "trace, memory or report")
    cmd.add_argument("job_id", metavar="ID")
    shown = cmd.add_mutually_exclusive_group()
    shown.add_argument("--trace", action="store_true", help="the pass trace as a table")
    shown.add_argument("--memory", action="store_true", help="the memory plan per space")
    shown.add_argument("--report", action="store_true", help="the whole report (JSON)")
    cmd.add_argument("-o", "--output", metavar="OUT", help="download the optimized model here; OUT.tar: the model "
                                                           "and its external data as one tar")
    cmd.add_argument("--chrome-trace", metavar="FILE.json", help="save the trace as a Chrome trace-event file")
    cmd.add_argument("--json", action="store_true", help="print JSON instead of tables")
    _add_connection_arguments(cmd)
    cmd.set_defaults(func=run_job)

    cmd = commands.add_parser("cancel", help="cancel a job of a mirserve service")
    cmd.add_argument("job_id", metavar="ID")
    _add_connection_arguments(cmd)
    cmd.set_defaults(func=run_cancel)


def _add_connection_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--server", metavar="URL", help="the service (default: MIRSERVE_SERVER, else "
                                                     "http://127.0.0.1:8000)")
    cmd.add_argument("--token", help="API key sent as a bearer token (default: MIRSERVE_TOKEN)")


def _remote(run: Callable[[argparse.Namespace, Client], int]) -> Callable[[argparse.Namespace], int]:
    """Open the client for the command; a client error is one line on stderr and exit status 1."""

    @functools.wraps(run)
    def command(args: argparse.Namespace) -> int:
        try:
            with Client(args.server, token=args.token) as client:
                return run(args, client)
        except ProblemError as error:
            print(f"mirserve: error: {error} [HTTP {error.status}]", file=sys.stderr)
        except MirserveClientError as error:
            print(f"mirserve: error: {error}", file=sys.stderr)
        return 1

    return command


@_remote
def run_submit(args: argparse.Namespace, client: Client) -> int:
    from worker.engine.api import check_picture_targets, options_from_args, print_outcome, write_pictures

    options = options_from_args(args)  # the same flags, checked the same way, as a local run
    check_picture_targets(args, options)
    sent = options.to_dict()
    places = sent.pop("places")
    job = client.submit(args.model, places, callback_url=args.callback_url, **sent)
    if not (args.wait or args.output):
        print(json.dumps(job.data, indent=2) if args.json else f"{job.id} {job.status}")
        return 0
    _follow(job, show=not (args.quiet or args.json))
    report = job.report()
    if args.output:
        job.download(args.output, archive=args.output.endswith(".tar"))
        report["model"]["output"]["path"] = str(args.output)
    write_pictures(report, args)
    print_outcome(report, args, subject=None if args.output else f"job {job.id} succeeded")
    return 0


def _follow(job: Job, show: bool) -> None:
    """Wait for the job, with a bar per pass on a terminal; a failure raises JobFailed / JobCanceled."""
    if not (show and sys.stderr.isatty()):
        job.wait(poll_interval=PROGRESS_POLL_SECONDS)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"{job.id[:8]} queued", total=None)

        def update(current: Job) -> None:
            progress = current.progress or {}
            bar.update(task, description=f"{current.id[:8]} {progress.get('current_pass') or current.status}",
                       completed=progress.get("index") or 0, total=progress.get("total") or None)

        job.wait(update, poll_interval=PROGRESS_POLL_SECONDS)


@_remote
def run_jobs(args: argparse.Namespace, client: Client) -> int:
    page = client.list_jobs(args.status, limit=args.limit)
    if args.json:
        print(json.dumps({**page, "items": [j.data for j in page["items"]]}, indent=2))
        return 0
    rows = [[j.id, j.status, j.data["created_at"][:19].replace("T", " "), j.data["input"]["filename"],
             j.data["places"], _nodes(j), _doing(j)] for j in page["items"]]
    print(_table(f"{len(rows)} of {page['total']} jobs", ["id", "status", "created", "model", "places", "nodes",
                                                           "pass or error"], rows, keep_whole=("id", "status")))
    return 0


def _nodes(job: Job) -> str:
    summary = job.summary or {}
    if summary.get("nodes_before") is None:
        return ""
    return f"{summary['nodes_before']} -> {summary['nodes_after']}"


def _doing(job: Job) -> str:
    if job.error:
        return f"{job.error['type']}: {job.error['message']}"
    progress = job.progress or {}
    if job.status == "running" and progress:
        return f"{progress['current_pass']} ({progress['index']}/{progress['total']})"
    return ""


@_remote
def run_job(args: argparse.Namespace, client: Client) -> int:
    job = client.job(args.job_id)
    if args.output:
        job.download(args.output, archive=args.output.endswith(".tar"))
    if args.chrome_trace:
        Path(args.chrome_trace).write_text(json.dumps(job.trace(format="chrome"), indent=1))
    if args.report or (args.json and (args.trace or args.memory)):
        data = job.report() if args.report else job.trace() if args.trace else job.memory()
        print(json.dumps(data, indent=2))
    elif args.trace:
        print(_trace_table(job.trace()))
    elif args.memory:
        _print_memory(job)
    elif args.json:
        print(json.dumps(job.data, indent=2))
    else:
        _print_job(job)
    return 0


def _print_job(job: Job) -> None:
    from worker.engine.api import print_outcome

    line = f"{job.id} {job.status}"
    if job.status == "running" and job.progress:
        line += f": {job.progress['current_pass']} ({job.progress['index']}/{job.progress['total']})"
    print(line)
    if job.error:
        raise JobFailed(job)
    if job.status == "succeeded":
        print_outcome(job.report(), argparse.Namespace(quiet=False, json=False), subject="summary")


def _print_memory(job: Job) -> None:
    from worker.engine.api import render_summary

    print(render_summary(job.report().get("summary") or {}, sections=("memory", "figures")))


def _trace_table(trace: list[dict[str, Any]]) -> str:
    rows = []
    for entry in trace:
        if entry.get("kind") == "fixed_point":
            continue
        nodes = f"{entry.get('nodes_before')} -> {entry.get('nodes_after')}" if entry.get("nodes_after") is not None \
            else ""
        rows.append([entry["pass"] + (f" #{entry['iteration']}" if entry.get("iteration", 1) != 1 else ""),
                     entry.get("kind") or "", f"{entry.get('seconds') or 0:.4f}", str(entry.get("rewrites") or 0),
                     nodes, entry.get("skipped") or ""])
    return _table("pass trace", ["pass", "kind", "seconds", "rewrites", "nodes", "skipped because"], rows)


def _table(title: str, columns: list[str], rows: list[list[Any]], keep_whole: tuple[str, ...] = ()) -> str:
    from worker.engine.api import render_table

    return render_table(title, columns, rows, keep_whole=keep_whole)


@_remote
def run_cancel(args: argparse.Namespace, client: Client) -> int:
    job = client.cancel(args.job_id)
    print(f"{job.id} {job.status}" + (" (cancel requested)" if job.data.get("cancel_requested")
                                      and job.status == "running" else ""))
    return 0
