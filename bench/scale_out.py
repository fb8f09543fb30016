"""Throughput against worker slots with an I/O-bound engine: does the service scale out linearly?

    python bench/scale_out.py                         # 1, 2, 4, 8 slots; SQLite + SqliteHuey
    python bench/scale_out.py --slots 1,2,4,8 --per-worker 2 --jobs-per-slot 12 --sleep 0.5 \
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test --redis-url redis://127.0.0.1:6379/0

The engine is ``bench.engines:sleeping`` (``MIRSERVE_ENGINE``): each job's engine process is forked, reports
one pass, sleeps ``--sleep`` seconds and copies the model through, so the figures are the job machinery's
(queue, claim, engine process, leases, publishing), not this machine's CPU. For each slot count N it starts
``mirserve api`` and ceil(N / per-worker) ``mirserve worker`` processes with N slots in all, submits
``--jobs-per-slot`` × N jobs at once (``cache: false``), and measures jobs per second from the first job's
creation to the last one's end (server timestamps). Linearity at N is throughput(N) / (N × throughput(1));
the goal is at least 0.9 at every N. Exit status 1 if a job fails or the goal is missed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_jobs import REPO, ScratchSchema, free_port, stop_services, wait_ready  # noqa: E402

GOAL = 0.9


def start(args, slots: int, data_dir: Path, port: int, log_dir: Path) -> tuple[list[subprocess.Popen], int]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MIRSERVE_DATA_DIR": str(data_dir), "MIRSERVE_PORT": str(port),
           "MIRSERVE_LOG_LEVEL": "warning", "MIRSERVE_AUTH": "none", "MIRSERVE_QUEUE_NAME": f"mirserve-scale-{port}",
           "MIRSERVE_ENGINE": "bench.engines:sleeping", "MIRSERVE_BENCH_SLEEP_SECONDS": str(args.sleep)}
    if args.database_url:
        env["MIRSERVE_DATABASE_URL"] = args.database_url
    if args.redis_url:
        env["MIRSERVE_REDIS_URL"] = args.redis_url
    subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    workers = math.ceil(slots / args.per_worker)
    commands = [["api"]] + [["worker", "--concurrency", str(min(args.per_worker, slots - i * args.per_worker))]
                            for i in range(workers)]
    processes = []
    for i, command in enumerate(commands):
        with open(log_dir / f"{slots}-{command[0]}-{i}.log", "wb") as log:
            processes.append(subprocess.Popen([sys.executable, "-m", "app.cli", *command], cwd=REPO, env=env,
                                              stdout=log, stderr=subprocess.STDOUT))
    return processes, workers


async def run_jobs(base: str, count: int, model: bytes) -> list[dict]:
    async with httpx.AsyncClient(base_url=base, timeout=120,
                                 limits=httpx.Limits(max_connections=16)) as client:
        async def submit(i: int) -> str:
            response = await client.post("/optimize", files={"model": (f"m{i}.onnx", model)},
                                         data={"places": "x86/fp32/nchw", "options": json.dumps({"cache": False})})
            response.raise_for_status()
            return response.json()["id"]

        ids = await asyncio.gather(*(submit(i) for i in range(count)))
        while True:
            await asyncio.sleep(0.2)
            page = (await client.get("/jobs", params={"limit": 1, "status": "succeeded"})).json()
            failed = (await client.get("/jobs", params={"limit": 1, "status": "failed"})).json()
            if failed["total"]:
                raise SystemExit(f"a job failed: {failed['items'][0]['error']}")
            if page["total"] >= count:
                break
        return [(await client.get(f"/jobs/{i}")).json() for i in ids]


def measure(args, slots: int, model: bytes, work: Path) -> dict:
    port = free_port()
    processes, workers = start(args, slots, work / f"data-{slots}", port, work)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, workers)
        count = args.jobs_per_slot * slots
        jobs = asyncio.run(run_jobs(base, count, model))
    finally:
        stop_services(processes)
    first = min(datetime.fromisoformat(j["created_at"]) for j in jobs)
    last = max(datetime.fromisoformat(j["finished_at"]) for j in jobs)
    seconds = (last - first).total_seconds()
    attempts = sorted({j["attempt"] for j in jobs})
    return {"slots": slots, "workers": workers, "jobs": count, "seconds": round(seconds, 2),
            "jobs_per_second": round(count / seconds, 3), "ideal_jobs_per_second": round(slots / args.sleep, 3),
            "attempts": attempts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", default="1,2,4,8")
    parser.add_argument("--per-worker", type=int, default=2, help="slots per worker process")
    parser.add_argument("--jobs-per-slot", type=int, default=12)
    parser.add_argument("--sleep", type=float, default=0.5)
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    from job_overhead import tiny_model

    model = tiny_model()
    work = Path(tempfile.mkdtemp(prefix="mirserve-scale-"))
    scratch = ScratchSchema(args.database_url) if (args.database_url or "").startswith("postgresql") else None
    if scratch is not None:
        args.database_url = scratch.url
    results = []
    try:
        for slots in [int(s) for s in args.slots.split(",")]:
            result = measure(args, slots, model, work)
            results.append(result)
    finally:
        if scratch is not None:
            scratch.drop()
    base = results[0]["jobs_per_second"] / results[0]["slots"]
    failed = False
    for result in results:
        result["linearity"] = round(result["jobs_per_second"] / (result["slots"] * base), 3)
        result["goal_met"] = result["linearity"] >= GOAL
        failed |= not result["goal_met"]
        print(json.dumps(result), flush=True)
    print(f"logs: {work}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
