"""Load test: a burst of jobs submitted at once to an API with two worker processes, while every job's client
polls ``GET /jobs/{id}``; prints the latency of those polls and checks that no job was lost or run twice.

    python bench/load_jobs.py                       # 50 jobs, 2 workers, SQLite + SqliteHuey
    python bench/load_jobs.py --redis-url redis://127.0.0.1:6379/0 \
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test

It starts ``mirserve api`` and ``--workers`` × ``mirserve worker`` (one job at a time each) on a temporary data
directory, submits ``--jobs`` copies of the model concurrently, and has one client per job poll its job every
``--poll-interval`` seconds (default 2, the Retry-After the server advertises), each from its own random
offset, as independent clients would, until it finishes. Latency is measured by the clients (wall time of
each request, so it includes the clients' own scheduling on this machine) and by the server (its
``Server-Timing`` header: from the request reaching the application to the response starting). Exit status 1 if a check fails (a job lost, failed or run twice, or the p99 goal
missed).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def default_model() -> Path:
    """The corpus classifier: ``shared/corpus`` beside the checkout or one of its parents, or $MIRSERVE_CORPUS."""
    if os.environ.get("MIRSERVE_CORPUS"):
        return Path(os.environ["MIRSERVE_CORPUS"]) / MODEL_NAME
    for parent in REPO.parents:
        if (parent / "shared" / "corpus" / MODEL_NAME).is_file():
            return parent / "shared" / "corpus" / MODEL_NAME
    return REPO.parent / "shared" / "corpus" / MODEL_NAME

TERMINAL = {"succeeded", "failed", "canceled"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", type=Path, default=default_model())
    parser.add_argument("--places", default="arm/fp16/nhwc,arm/fp32/nchw")
    parser.add_argument("--options", default='{"input_shapes": {"x": [1, 3, 48, 192]}}')
    parser.add_argument("--poll-interval", type=float, default=2.0,
                        help="seconds between one client's polls (default: the server's Retry-After, 2)")
    parser.add_argument("--database-url", help="job table URL (default: SQLite in the data directory)")
    parser.add_argument("--redis-url", help="use RedisHuey on this server (default: SqliteHuey)")
    parser.add_argument("--p99-goal-ms", type=float, default=50.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ScratchSchema:
    """A throw-away PostgreSQL schema for one run, so the load leaves no tables behind."""

    def __init__(self, url: str):
        import secrets

        import sqlalchemy

        self.name = f"mirserve_load_{secrets.token_hex(4)}"
        self.admin = sqlalchemy.create_engine(url)
        with self.admin.begin() as conn:
            conn.execute(sqlalchemy.text(f"CREATE SCHEMA {self.name}"))
        self.url = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{self.name}"

    def drop(self) -> None:
        import sqlalchemy

        with self.admin.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {self.name} CASCADE"))
        self.admin.dispose()


def start_processes(args, data_dir: Path, port: int, log_dir: Path) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MIRSERVE_DATA_DIR": str(data_dir), "MIRSERVE_PORT": str(port),
           "MIRSERVE_LOG_LEVEL": "warning", "MIRSERVE_AUTH": "none", "MIRSERVE_QUEUE_NAME": f"mirserve-load-{port}"}
    if args.database_url:
        env["MIRSERVE_DATABASE_URL"] = args.database_url
    if args.redis_url:
        env["MIRSERVE_REDIS_URL"] = args.redis_url
    subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    commands = [["api"]] + [["worker", "--concurrency", "1"]] * args.workers
    processes = []
    for i, command in enumerate(commands):
        log = open(log_dir / f"{command[0]}-{i}.log", "wb")
        processes.append(subprocess.Popen([sys.executable, "-m", "app.cli", *command], cwd=REPO, env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
    return processes


def wait_ready(base: str, workers: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            metrics = httpx.get(f"{base}/metrics", timeout=5).text
            if f"mirserve_workers {workers}" in metrics.splitlines():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the service did not come up with {workers} workers within {timeout} s")


def limits(jobs: int) -> httpx.Limits:
    return httpx.Limits(max_connections=jobs + 10, max_keepalive_connections=jobs + 10)


async def submit_all(args, base: str, ids: multiprocessing.Queue) -> list[float]:
    """Submit every job at once; each id goes to the pollers as soon as it is accepted. Returns submit times."""
    model = args.model.read_bytes()
    options = json.dumps({**json.loads(args.options), "cache": False})  # every copy runs: none reuses another's
    submits: list[float] = []

    async def submit(client: httpx.AsyncClient, index: int) -> None:
        started = time.perf_counter()
        response = await client.post("/optimize", files={"model": (f"model-{index}.onnx", model)},
                                     data={"places": args.places, "options": options})
        submits.append(time.perf_counter() - started)
        response.raise_for_status()
        ids.put(response.json()["id"])

    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits(args.jobs)) as client:
        await asyncio.gather(*(submit(client, i) for i in range(args.jobs)))
    return submits


def poll_all(base: str, jobs: int, interval: float, ids: multiprocessing.Queue, out: multiprocessing.Queue) -> None:
    """In its own process (so the uploads' CPU is not counted): one polling client per job until it ends."""
    polls: list[float] = []
    server: list[float] = []

    async def poll(client: httpx.AsyncClient, job_id: str) -> dict:
        # Independent clients do not poll in lockstep: each starts at its own offset within the interval.
        await asyncio.sleep(random.uniform(0, interval))
        while True:
            await asyncio.sleep(interval)
            started = time.perf_counter()
            response = await client.get(f"/jobs/{job_id}")
            polls.append(time.perf_counter() - started)
            server.append(float(response.headers["server-timing"].split("dur=")[1]) / 1000)
            if (job := response.json())["status"] in TERMINAL:
                return job

    async def main() -> list[dict]:
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits(jobs)) as client:
            tasks = [asyncio.create_task(poll(client, await loop.run_in_executor(None, ids.get)))
                     for _ in range(jobs)]
            return await asyncio.gather(*tasks)

    finished = asyncio.run(main())
    out.put((finished, polls, server))


def burst(args, base: str) -> tuple[list[dict], dict[str, list[float]], float]:
    """Run the burst; returns the jobs, the latencies (client-side and server-side polls, submits), the time."""
    context = multiprocessing.get_context("spawn")
    ids, out = context.Queue(), context.Queue()
    poller = context.Process(target=poll_all, args=(base, args.jobs, args.poll_interval, ids, out))
    poller.start()
    started = time.perf_counter()
    submits = asyncio.run(submit_all(args, base, ids))
    jobs, polls, server = out.get(timeout=args.timeout)
    seconds = time.perf_counter() - started
    poller.join()
    return jobs, {"polls": polls, "server": server, "submits": submits}, seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered))) - 1))]


def check_outcome(jobs: list[dict], data_dir: Path, base: str, expected: int) -> list[str]:
    problems = []
    ids = [j["id"] for j in jobs]
    if len(set(ids)) != expected:
        problems.append(f"{expected - len(set(ids))} job(s) lost")
    not_ok = [j for j in jobs if j["status"] != "succeeded"]
    if not_ok:
        problems.append(f"{len(not_ok)} job(s) did not succeed, e.g. {not_ok[0]['status']}: {not_ok[0]['error']}")
    rerun = [j["id"] for j in jobs if j["attempt"] != 1]
    if rerun:
        problems.append(f"{len(rerun)} job(s) ran more than once")
    listed = httpx.get(f"{base}/jobs", params={"limit": 1}).json()["total"]
    if listed != expected:
        problems.append(f"the job table holds {listed} jobs, not {expected}")
    published = sum(len(list((data_dir / "jobs" / i).glob("attempt-*/model.onnx"))) for i in ids)
    if published != expected:
        problems.append(f"{published} artifacts on disk for {expected} jobs")
    return problems


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def figures_of(args, jobs: list[dict], latencies: dict[str, list[float]], seconds: float,
               load: tuple[float, float], problems: list[str]) -> dict:
    engine = [j["summary"]["seconds"] for j in jobs if j.get("summary")]
    polls, server, submits = latencies["polls"], latencies["server"], latencies["submits"]
    return {
        "jobs": args.jobs, "workers": args.workers, "model": args.model.name,
        "queue": "redis" if args.redis_url else "sqlite", "database": (args.database_url or "sqlite").split(":")[0],
        "burst_seconds": round(seconds, 2), "jobs_per_second": round(args.jobs / seconds, 2),
        "engine_seconds_mean": round(statistics.mean(engine), 3) if engine else None,
        "submit_ms": {"p50": ms(percentile(submits, 50)), "p99": ms(percentile(submits, 99))},
        "get_job_ms": {"requests": len(polls), "p50": ms(percentile(polls, 50)), "p95": ms(percentile(polls, 95)),
                       "p99": ms(percentile(polls, 99)), "max": ms(max(polls))},
        "get_job_server_ms": {"p50": ms(percentile(server, 50)), "p95": ms(percentile(server, 95)),
                              "p99": ms(percentile(server, 99)), "max": ms(max(server))},
        "poll_interval_seconds": args.poll_interval,
        "machine_load_average": [round(load[0], 2), round(load[1], 2)],
        "all_succeeded_once": not problems,
    }


def run(args, data_dir: Path) -> tuple[dict, list[str]]:
    """Start the service, run the burst, stop the service; returns the figures and the failed checks."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    scratch = ScratchSchema(args.database_url) if (args.database_url or "").startswith("postgresql") else None
    if scratch is not None:
        args.database_url = scratch.url
    processes = start_processes(args, data_dir / "data", port, data_dir)
    load_before = os.getloadavg()[0]
    try:
        wait_ready(base, args.workers)
        jobs, latencies, seconds = burst(args, base)
        problems = check_outcome(jobs, data_dir / "data", base, args.jobs)
    finally:
        stop_services(processes)
        if scratch is not None:
            scratch.drop()
    load = (load_before, os.getloadavg()[0])
    return figures_of(args, jobs, latencies, seconds, load, problems), problems


def stop_services(processes: list[subprocess.Popen], grace: float = 30) -> None:
    """SIGTERM every service process, then kill what has not stopped within ``grace`` seconds."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def compile_project() -> None:
    """Byte-compile the project once: with PYTHONDONTWRITEBYTECODE (set on this machine) every run would
    otherwise compile all of mirserve's modules again (0.6 s), which an installed package never does."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "worker"), str(REPO / "app")],
                   check=True)


def main() -> int:
    args = parse_args()
    if not args.model.is_file():
        raise SystemExit(f"no model at {args.model}; pass --model")
    data_dir = Path(tempfile.mkdtemp(prefix="mirserve-load-"))
    figures, problems = run(args, data_dir)
    print(json.dumps(figures, indent=2))
    if figures["get_job_ms"]["p99"] >= args.p99_goal_ms:
        problems.append(f"GET /jobs/{{id}} p99 {figures['get_job_ms']['p99']} ms is not under {args.p99_goal_ms:g} ms")
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    print(f"logs and data: {data_dir}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
