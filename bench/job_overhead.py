"""What the job machinery adds to a small job: submit-to-``succeeded`` minus the engine's own time.

    python bench/job_overhead.py                  # SQLite + SqliteHuey, and PostgreSQL + Redis if reachable
    python bench/job_overhead.py --jobs 50 --backends sqlite --warm 1

For each backend (the embedded SQLite job table and queue; PostgreSQL and Redis) and each way of starting
engine processes (``MIRSERVE_WARM_ENGINES=1``: forked from a fork server that has imported the engine;
``0``: a fresh interpreter per job), it starts ``mirserve api`` and one ``mirserve worker`` on a temporary data
directory, runs two warm-up jobs, then submits ``--jobs`` jobs one after another, each when the previous one
has succeeded (so none waits in the queue), on a tiny model (two nodes) with ``cache: false``; then
``--idle-jobs`` more, each after ``--idle`` seconds without work (an idle worker that polls its queue, SQLite's,
looks less often the longer it waits; what a lone job on a quiet service sees). Per job:

- server: ``finished_at - created_at`` (both stamped by the service: the upload is stored, the row inserted,
  and then the queue, the claim, the engine process, publishing and the final commit) minus the engine's own
  ``seconds`` from its report;
- client: from sending the POST to seeing ``succeeded`` (polled every 20 ms) minus the same engine seconds.

Prints median and p95 of each, back to back and after idling, and the goal (server median and p95 at most
0.15 s, both ways) met or missed. Exit
status 1 if a job fails or the goal is missed with warm engines.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_jobs import REPO, ScratchSchema, free_port, percentile, stop_services, wait_ready  # noqa: E402

POSTGRES_URL = os.environ.get("MIRSERVE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("MIRSERVE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
GOAL_SECONDS = 0.15


def tiny_model() -> bytes:
    """x[1, 8] -> Relu -> Add(constant) -> y: the smallest model with a pass or two to run."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bias = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(1, 8), "bias")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "bias"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [bias])
    # IR 10: onnx 1.23 writes IR 14 by default, which onnxruntime 1.31 (IR 13 at most) cannot load
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def start(data_dir: Path, port: int, env_extra: dict[str, str], log_dir: Path) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MIRSERVE_DATA_DIR": str(data_dir), "MIRSERVE_PORT": str(port),
           "MIRSERVE_LOG_LEVEL": "warning", "MIRSERVE_AUTH": "none", "MIRSERVE_QUEUE_NAME": f"mirserve-overhead-{port}", **env_extra}
    subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    processes = []
    for name, command in (("api", ["api"]), ("worker", ["worker", "--concurrency", "1"])):
        with open(log_dir / f"{name}-{port}.log", "wb") as log:
            processes.append(subprocess.Popen([sys.executable, "-m", "app.cli", *command], cwd=REPO, env=env,
                                              stdout=log, stderr=subprocess.STDOUT))
    return processes


def stop(processes: list[subprocess.Popen]) -> None:
    stop_services(processes)


def one_job(client: httpx.Client, model: bytes) -> dict[str, float]:
    sent = time.perf_counter()
    response = client.post("/optimize", files={"model": ("tiny.onnx", model)},
                           data={"places": "x86/fp32/nchw", "options": json.dumps({"cache": False})})
    response.raise_for_status()
    job = response.json()
    while job["status"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.02)
        job = client.get(f"/jobs/{job['id']}").json()
    seen = time.perf_counter()
    if job["status"] != "succeeded":
        raise SystemExit(f"job {job['id']} {job['status']}: {job.get('error')}")
    engine = float(job["summary"]["seconds"])
    server = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["created_at"])).total_seconds()
    return {"engine": engine, "server": server - engine, "client": seen - sent - engine}


def measure(backend: str, warm: bool, jobs: int, model: bytes, work: Path, idle_jobs: int = 0,
            idle: float = 0.0) -> dict:
    env = {"MIRSERVE_WARM_ENGINES": "1" if warm else "0"}
    scratch = None
    if backend == "postgres+redis":
        scratch = ScratchSchema(POSTGRES_URL)
        env.update(MIRSERVE_DATABASE_URL=scratch.url, MIRSERVE_REDIS_URL=REDIS_URL)
    port = free_port()
    data_dir = work / f"{backend}-{'warm' if warm else 'cold'}"
    processes = start(data_dir, port, env, work)
    try:
        wait_ready(f"http://127.0.0.1:{port}", 1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for _ in range(2):
                one_job(client, model)
            runs = [one_job(client, model) for _ in range(jobs)]
            idle_runs = []
            for _ in range(idle_jobs):
                time.sleep(idle)
                idle_runs.append(one_job(client, model))
    finally:
        stop(processes)
        if scratch is not None:
            scratch.drop()

    def stats(name: str, of: list[dict]) -> dict[str, float]:
        values = [r[name] for r in of]
        return {"median": round(statistics.median(values), 3), "p95": round(percentile(values, 95), 3)}

    server = stats("server", runs)
    result = {"backend": backend, "warm_engines": warm, "jobs": jobs, "overhead_server_s": server,
              "overhead_client_s": stats("client", runs), "engine_s": stats("engine", runs)}
    met = server["median"] <= GOAL_SECONDS and server["p95"] <= GOAL_SECONDS
    if idle_runs:
        after_idle = stats("server", idle_runs)
        result.update(idle_jobs=idle_jobs, idle_s=idle, overhead_server_after_idle_s=after_idle)
        met = met and after_idle["median"] <= GOAL_SECONDS and after_idle["p95"] <= GOAL_SECONDS
    return {**result, "goal_met": met}


def reachable(backend: str) -> str | None:
    if backend == "sqlite":
        return None
    try:
        import redis
        import sqlalchemy

        engine = sqlalchemy.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
        with engine.connect():
            pass
        engine.dispose()
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--backends", default="sqlite,postgres+redis")
    parser.add_argument("--warm", choices=["0", "1", "both"], default="both")
    parser.add_argument("--idle-jobs", type=int, default=5, help="jobs submitted after idling (default 5)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before each of them (default 3)")
    args = parser.parse_args()
    model = tiny_model()
    work = Path(tempfile.mkdtemp(prefix="mirserve-overhead-"))
    results, failed = [], False
    for backend in args.backends.split(","):
        why = reachable(backend)
        if why:
            print(f"skipping {backend}: {why}", file=sys.stderr)
            continue
        for warm in ([False, True] if args.warm == "both" else [args.warm == "1"]):
            result = measure(backend, warm, args.jobs, model, work, args.idle_jobs, args.idle)
            print(json.dumps(result), flush=True)
            results.append(result)
            failed |= warm and not result["goal_met"]
    print(f"logs: {work}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
