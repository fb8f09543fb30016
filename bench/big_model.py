"""mirserve optimize on a model larger than memory, side by side with copying its files (issue 13).

Generates a Llama-architecture decoder with random fp16 weights in external data (``bench/make_llama.py``;
the 7B-class shapes by default, about 12 GB) unless it exists, then measures under ``/usr/bin/time -v``, in one
run and in this order: ``cp`` of the model and its data file, ``mirserve optimize --no-verify`` and
``mirserve optimize`` with verification (by regions: only where the optimized graph differs from the input,
``worker/engine/regions.py``). Prints wall
time and peak RSS of each, and the ratios the issue asks for: optimize within 1.5x of cp, peak RSS at most
2 GB plus the largest single tensor. ``sync`` runs before each step, so none pays for another's writes.

The places keep fp16 (``arm/fp16/nchw,arm/fp32/nchw``): the default x86/fp32 place would convert every
weight to fp32, doubling the output. The default tolerances of fp16 (rtol 1e-2, atol 1e-3) are loosened to
atol 2e-2 by default: logits summed over 4096 fp16 products differ by an ulp or two (0.004 at magnitude 2-4)
between any two association orders, including onnxruntime's own kernels on the unchanged model.

Usage: python bench/big_model.py [--dir /work/bigmodel/7b] [--no-verify-run] [--keep]
[--make-args "--layers 2"] [--places P] [--atol X]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from load_jobs import compile_project  # noqa: E402
# this checkout's mirserve (a worktree has no venv of its own): the interpreter running the bench, on REPO
MIRSERVE = [sys.executable, "-m", "app.cli"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
SECTION = "## Models larger than memory"


def timed(command: list[str]) -> dict:
    subprocess.run(["sync"], check=True)
    done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, env=ENV)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", done.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    seconds = 0.0
    if wall:
        for part in wall.group(1).split(":"):
            seconds = seconds * 60 + float(part)
    result = {"seconds": round(seconds, 2), "rss_mb": int(rss.group(1)) // 1024 if rss else None,
              "code": done.returncode}
    if done.returncode != 0:
        result["error"] = [line for line in done.stderr.splitlines() if "error" in line.lower()][-1:]
    return result


def main() -> None:
    compile_project()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/work/bigmodel/7b", help="where the model is (or is made)")
    parser.add_argument("--make-args", default="", help="arguments for bench/make_llama.py (default: 7B class)")
    parser.add_argument("--places", default="arm/fp16/nchw,arm/fp32/nchw")
    parser.add_argument("--atol", default="2e-2")
    parser.add_argument("--verify-seconds", default="3600")
    parser.add_argument("--no-verify-run", action="store_true", help="skip the run with verification")
    parser.add_argument("--keep", action="store_true", help="keep the outputs and the copy")
    parser.add_argument("--markdown", help="write the table into this file's section")
    parser.add_argument("--rows", help="the JSON line an earlier run printed: make the table from it, measure nothing")
    args = parser.parse_args()
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / "llama.onnx"
    data = directory / "llama.onnx.data"
    if not model.exists() or not data.exists():
        subprocess.run([sys.executable, str(REPO / "bench" / "make_llama.py"), str(model),
                        *shlex.split(args.make_args)], check=True)
    total = model.stat().st_size + data.stat().st_size
    largest = _largest_tensor(model)
    if args.rows:
        rows = json.loads([line for line in Path(args.rows).read_text().splitlines() if line.startswith("{")][-1])
    else:
        rows = measure(args, directory, model, data)
    report(args, model, total, largest, rows)


def measure(args: argparse.Namespace, directory: Path, model: Path, data: Path) -> dict:
    rows = {}
    copy = directory / "copy"
    copy.mkdir(exist_ok=True)
    rows["cp"] = timed(["cp", str(model), str(data), str(copy)])
    shutil.rmtree(copy)
    out = directory / "out.onnx"
    common = [*MIRSERVE, "optimize", str(model), "-o", str(out), "--places", args.places, "--quiet"]
    rows["optimize --no-verify"] = timed([*common, "--no-verify", "--report", str(directory / "noverify.json")])
    _clean(out, args.keep and args.no_verify_run)
    if not args.no_verify_run:
        rows["optimize (verified)"] = timed([*common, "--atol", args.atol, "--limit",
                                             f"verify_seconds={args.verify_seconds}", "--report",
                                             str(directory / "verified.json")])
        report = directory / "verified.json"
        if report.exists():
            verification = json.loads(report.read_text()).get("verification") or {}
            rows["optimize (verified)"]["verification"] = {
                k: verification.get(k) for k in ("passed", "runs", "shapes", "pieces_of_mb", "seconds", "method",
                                                 "summary", "regions_refused")}
            rows["optimize (verified)"]["max_abs_diff"] = max(
                (o.get("max_abs_diff") or 0 for o in verification.get("outputs", [])), default=None)
        _clean(out, args.keep)
    return rows


def report(args: argparse.Namespace, model: Path, total: int, largest: int, rows: dict) -> None:
    bound_mb = 2048 + largest // 2**20
    lines = [f"`{model.name}` from `bench/make_llama.py {args.make_args or '(7B-class defaults)'}`: {total / 1e9:.2f} GB with its external "
             f"data, largest tensor {largest / 2**20:.0f} MiB; places `{args.places}`; measured by "
             f"`python bench/big_model.py`, each step under `/usr/bin/time -v` after a `sync`.", "",
             "| step | wall s | x cp | peak RSS MB | RSS goal MB (2 GB + largest tensor) | verification |",
             "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        ratio = row["seconds"] / rows["cp"]["seconds"] if rows["cp"]["seconds"] else float("nan")
        bound = "" if name == "cp" else str(bound_mb)
        check = row.get("verification")
        how = check.get("summary") if check and check.get("method") == "regions" else (
            f"whole model in pieces of {check.get('pieces_of_mb')} MB, max abs diff {row.get('max_abs_diff')}"
            if check else "")
        verified = "" if not check else (f"passed={check.get('passed')} on {check.get('shapes')}, {how}, "
                                         f"{check.get('seconds')} s")
        failed = f" (exit {row['code']}: {row.get('error')})" if row["code"] else ""
        lines.append(f"| {name}{failed} | {row['seconds']:.1f} | {ratio:.2f} | {row['rss_mb']} | {bound} | "
                     f"{verified} |")
    lines += ["",
              "- Verification by regions (`worker/engine/regions.py`): the optimized graph is matched with the input "
              "from the outputs back (same op, attributes and weights -- the untouched weights known by their place "
              "in the input's files, never hashed); only the regions where they differ run, both sides on onnxruntime "
              "from the same boundary values (seeded random floats of the inferred shapes; the sequence length, "
              "rotary tables and causal mask from the input model's own cheap prefix), compared as outputs are. "
              "The input shapes are the first choice and its batch-2 twin, untried (a whole run of the input model "
              "would cost what the regions save). Where regions cannot be formed, both models run whole in pieces "
              "of 256 MB of weights (`worker/engine/chunked.py`), as before.",
              f"- `--atol {args.atol}` is for the whole-model fallback: fp16 logits summed over 4096 products differ "
              "by an ulp or two between association orders; the default fp16 atol (1e-3) fails the same way with "
              "both models run whole (a 2-layer slice of this model: 0.0039). Regions compare values a few ops "
              "deep, far inside the default tolerances.",
              "- The places keep fp16: the default `x86/fp32/nchw` converts every weight to fp32 (twice the output).",
              "- `python bench/big_model.py` makes the model when it is missing; `--rows LOG` renders an earlier "
              "run's figures (its last JSON line)."]
    table = "\n".join(lines)
    print(table)
    print(json.dumps(rows))
    if args.markdown:
        from bert_base_speed import write_section

        write_section(Path(args.markdown), table, SECTION)


def _largest_tensor(model: Path) -> int:
    import numpy as np
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    sizes = [int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
             for t in proto.graph.initializer]
    return max(sizes, default=0)


def _clean(out: Path, keep: bool) -> None:
    if keep:
        return
    for path in (out, out.with_name(out.name + ".data")):
        if path.exists():
            os.unlink(path)


if __name__ == "__main__":
    main()
