"""A real model's job end to end against the command line running the same optimization.

    python bench/job_vs_cli.py                                  # the corpus classifier, 10 runs each
    python bench/job_vs_cli.py MODEL --places arm/fp16/nhwc,arm/fp32/nchw --runs 10

Per run, interleaved: ``mirserve optimize MODEL -o OUT --places P`` as a user types it (a fresh interpreter,
wall time from start to exit), and a job on a running ``mirserve api`` + ``mirserve worker`` (embedded
SQLite, warm engines, ``cache: false``): wall time from sending the upload to seeing ``succeeded`` (polled
every 20 ms). Prints the median of each and whether the job is no slower than the command line (the goal of
issue 16). Exit status 1 if it is slower or a run fails.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job_overhead import start, stop  # noqa: E402
from load_jobs import REPO, compile_project, free_port, wait_ready  # noqa: E402

CLASSIFIER = REPO.parent / "shared" / "corpus" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def cli_run(model: Path, places: str, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.cli", "optimize", str(model), "-o", str(out), "--places", places,
                    "--quiet"], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - started


def job_run(client: httpx.Client, model: bytes, name: str, places: str) -> float:
    started = time.perf_counter()
    response = client.post("/optimize", files={"model": (name, model)},
                           data={"places": places, "options": json.dumps({"cache": False})})
    response.raise_for_status()
    job = response.json()
    while job["status"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.02)
        job = client.get(f"/jobs/{job['id']}").json()
    if job["status"] != "succeeded":
        raise SystemExit(f"job {job['id']} {job['status']}: {job.get('error')}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, default=CLASSIFIER)
    parser.add_argument("--places", default="x86/fp32/nchw")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    compile_project()
    work = Path(tempfile.mkdtemp(prefix="mirserve-job-vs-cli-"))
    port = free_port()
    processes = start(work / "data", port, {"MIRSERVE_WARM_ENGINES": "1"}, work)
    model = args.model.read_bytes()
    cli, job = [], []
    try:
        wait_ready(f"http://127.0.0.1:{port}", 1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            job_run(client, model, args.model.name, args.places)  # warm-up: the fork server's first job
            for _ in range(args.runs):
                cli.append(cli_run(args.model, args.places, work / "cli.onnx"))
                job.append(job_run(client, model, args.model.name, args.places))
    finally:
        stop(processes)
    result = {"model": args.model.name, "places": args.places, "runs": args.runs,
              "cli_s": {"median": round(statistics.median(cli), 3), "min": round(min(cli), 3)},
              "job_s": {"median": round(statistics.median(job), 3), "min": round(min(job), 3)}}
    result["goal_met"] = result["job_s"]["median"] <= result["cli_s"]["median"]
    print(json.dumps(result))
    print(f"logs: {work}", file=sys.stderr)
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
