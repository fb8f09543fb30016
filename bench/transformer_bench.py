"""Node counts on the transformer exports (``bench/transformer_exports.py``): mirserve's default run and its
``--portable --target-opset 23`` run against onnxruntime's extended and basic levels, onnxsim and onnxslim,
with mirserve's verification figures. Prints a Markdown table (the one in BENCHMARKS.md) and, per row, whether
the goals of issue 13 hold: the default output has no more nodes than onnxruntime extended, and the portable
one (standard ops only) fewer than every standard-op peer (onnxruntime basic, onnxsim, onnxslim).

mirserve runs in its own child (``--mirserve-python``, default the project's .venv) with verification on (one
seeded random input, rtol 1e-4 / atol 1e-5 against the export on onnxruntime); the peers run through
``../shared/bench/peers.py`` under ``--peers-python`` (a Python with onnxsim, onnxslim and onnxruntime; e.g.
``python3 -m venv bench/out/peers-venv && bench/out/peers-venv/bin/pip install onnxsim onnxslim onnxruntime``).

Usage: python bench/transformer_bench.py [--exports DIR] [--only MODEL ...] [--peers-python PY]
[--markdown BENCHMARKS.md] (writes its section, from "## Transformer exports" to the next "## ", leaving the rest)
"""
from __future__ import annotations

import argparse
import json
import platform
import time
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPORTS = REPO / "bench" / "out" / "transformers"
PEERS_SCRIPT = next((p for p in (REPO.parent / "shared" / "bench" / "peers.py",
                                 REPO.parents[1] / "shared" / "bench" / "peers.py") if p.exists()),
                    REPO.parent / "shared" / "bench" / "peers.py")
PEERS = ("ort_extended", "ort_basic", "onnxsim", "onnxslim")
STANDARD_PEERS = ("ort_basic", "onnxsim", "onnxslim")
RUNS = {"default": [], "portable": ["--portable", "--target-opset", "23"]}
HEADER = ("| model | exporter | original | mirserve default | mirserve --portable --target-opset 23 | ort extended | "
          "ort basic | onnxsim | onnxslim | verified (max abs diff) | default <= ort extended | "
          "portable < standard-op peers |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
SECTION = "## Transformer exports"


def mirserve(path: Path, flags: list[str], python: Path, scratch: Path) -> dict:
    out, report = scratch / f"{path.stem}.out.onnx", scratch / f"{path.stem}.report.json"
    child = subprocess.run([str(python), "-m", "app.cli", "optimize", str(path), "-o", str(out), "--report",
                            str(report), "--quiet", *flags], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if child.returncode != 0:
        return {"error": (child.stderr.strip().splitlines() or ["?"])[-1][:200]}
    data = json.loads(report.read_text())
    verification = data.get("verification") or {}
    diffs = [o.get("max_abs_diff") or 0.0 for o in verification.get("outputs", [])]
    return {"nodes": data["model"]["output"]["nodes"], "verified": verification.get("passed"),
            "max_abs_diff": max(diffs, default=None), "seconds": data.get("seconds")}


def peers(path: Path, python: Path) -> dict:
    only = [arg for peer in PEERS for arg in ("--only", peer)]
    child = subprocess.run([str(python), str(PEERS_SCRIPT), str(path), *only, "--no-check"], capture_output=True,
                           text=True, timeout=1800)
    if child.returncode != 0:
        return {peer: (child.stderr.strip().splitlines() or ["?"])[-1][:80] for peer in PEERS}
    rows = json.loads(child.stdout.strip().splitlines()[-1])["rows"]
    return {r["peer"]: r.get("nodes", r.get("error")) for r in rows}


def row(path: Path, mirserve_python: Path, peers_python: Path, scratch: Path) -> tuple[str, bool]:
    model, exporter = path.stem.split(".")
    ours = {name: mirserve(path, flags, mirserve_python, scratch) for name, flags in RUNS.items()}
    theirs = peers(path, peers_python)
    default, portable = ours["default"].get("nodes"), ours["portable"].get("nodes")
    goal_default = isinstance(default, int) and isinstance(theirs.get("ort_extended"), int) \
        and default <= theirs["ort_extended"]
    standard = [theirs.get(p) for p in STANDARD_PEERS]
    goal_portable = isinstance(portable, int) and all(isinstance(n, int) and portable < n for n in standard)
    verified = all(r.get("verified") for r in ours.values())
    diff = max((r.get("max_abs_diff") or 0.0 for r in ours.values()), default=0.0)

    def cell(result: dict) -> str:
        return str(result["nodes"]) if "nodes" in result else f"error: {result['error']}"

    cells = [model, exporter, str(theirs.get("original")), cell(ours["default"]), cell(ours["portable"]),
             *(str(theirs.get(p)) for p in PEERS), f"{'yes' if verified else 'NO'} ({diff:.1e})",
             "yes" if goal_default else "NO", "yes" if goal_portable else "NO"]
    return "| " + " | ".join(cells) + " |", goal_default and goal_portable and verified


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exports", type=Path, default=EXPORTS)
    parser.add_argument("--only", action="append", help="only this model (repeatable)")
    parser.add_argument("--mirserve-python", type=Path, default=REPO / ".venv" / "bin" / "python")
    parser.add_argument("--markdown", type=Path, help="write the table as this file's transformer section")
    parser.add_argument("--peers-python", type=Path, default=REPO / "bench" / "out" / "peers-venv" / "bin" / "python")
    args = parser.parse_args(argv)
    paths = sorted(p for p in args.exports.glob("*.onnx") if p.stem.count(".") == 1
                   and (not args.only or p.stem.split(".")[0] in args.only))
    if not paths:
        print(f"no exports in {args.exports}: run bench/transformer_exports.py first", file=sys.stderr)
        return 1
    print(HEADER)
    met, lines = True, []
    with tempfile.TemporaryDirectory() as scratch:
        for path in paths:
            line, ok = row(path, args.mirserve_python, args.peers_python, Path(scratch))
            met &= ok
            lines.append(line)
            print(line, flush=True)
    if args.markdown:
        write_section(args.markdown, lines, " ".join(sys.argv[1:]))
    return 0 if met else 1


def write_section(path: Path, lines: list[str], arguments: str) -> None:
    """Replace this script's section of ``path`` (from SECTION to the next section) with the table just measured."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    text = path.read_text() if path.exists() else ""
    head = (text[:text.find("\n" + SECTION)] if ("\n" + SECTION) in text else text).rstrip("\n")
    start = text.find("\n" + SECTION)
    end = text.find("\n## ", start + 1) if start >= 0 else -1
    tail = text[end:] if end >= 0 else ""  # sections other scripts write after this one stay
    section = [
        "", SECTION, "",
        f"Command: `python bench/transformer_bench.py{(' ' + arguments) if arguments else ''}` on the exports of "
        f"`bench/transformer_exports.py` (2 layers, hidden 64, batch 1, sequence 16, random weights).",
        "",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, git {commit}, Python "
        f"{platform.python_version()}.",
        "",
        "Nodes of the output; `verified` is mirserve's own check of both runs (one seeded random input, onnxruntime, "
        "rtol 1e-4 / atol 1e-5) with the larger max abs diff. Goals of issue 13: the default output has no more "
        "nodes than onnxruntime extended; --portable (standard ops only, opset raised to 23) fewer than every "
        "standard-op peer (ort basic, onnxsim, onnxslim).",
        "", HEADER, *lines, "",
    ]
    path.write_text(head + "\n" + "\n".join(section) + tail)


if __name__ == "__main__":
    sys.exit(main())
