"""Benchmark mirserve against the peer ONNX optimizers on every corpus and light model, and a 575 MB VGG-19.

For each model: mirserve ``--portable`` and default (``--no-verify``, each a child process whose wall time and
peak resident memory are its own), the peers (onnxoptimizer, onnxsim, onnxslim, onnxruntime basic/extended,
run by ../shared/bench/peers.py, whose JSON is parsed), and a plain ``onnx.load`` + ``onnx.save`` child. One
table: top-level node count, wall seconds, peak RSS, output bytes, max abs difference from the input model on
onnxruntime (seeded random inputs, graph optimizations off); then the issue's goals, each met or missed by
how much. ``--markdown BENCHMARKS.md`` also writes the table with the command and the machine.

Usage: python bench/compare.py [--only NAME ...] [--no-peers] [--markdown BENCHMARKS.md]
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The project runs from its checkout (it need not be installed): this process and its children import it.
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
#: Static shapes for the corpus models with dynamic inputs, as the corpus README gives them.
CORPUS_SHAPES = {
    "bert_small_dyn.onnx": {"input_ids": [2, 64], "attention_mask": [2, 64]},
    "ch_PP-OCRv4_det_infer.onnx": {"x": [1, 3, 640, 640]},
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": {"x": [1, 3, 48, 192]},
    "cls_qdq.onnx": {"x": [1, 3, 48, 192]},
}
LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512"]
PEERS = ["onnxoptimizer", "onnxsim", "onnxslim", "ort_basic", "ort_extended"]
BIG = "vgg19_575MB"


@dataclass
class Row:
    tool: str
    nodes: int | None = None
    seconds: float | None = None
    peak_mb: float | None = None
    bytes: int | None = None
    diff: float | str | None = None
    #: The whole child process, interpreter start and imports included (mirserve and load+save only).
    process_seconds: float | None = None
    #: CPU seconds (user + system) of that whole child: steadier than wall time on a shared machine.
    cpu_seconds: float | None = None
    error: str | None = None


@dataclass
class ModelRuns:
    name: str
    path: Path
    shapes: dict
    rows: dict[str, Row] = field(default_factory=dict)


# --- where things are -------------------------------------------------------------------------------------
def sibling(*parts: str) -> Path:
    """``../shared/...`` beside the checkout or one of its parents (git worktrees sit deeper)."""
    for parent in REPO.parents:
        candidate = parent.joinpath("shared", *parts)
        if candidate.exists():
            return candidate
    return REPO.parent.joinpath("shared", *parts)


def light_dir() -> Path:
    from importlib.util import find_spec  # onnx is not imported here: this process stays small (see measured)
    return Path(find_spec("onnx").origin).parent / "backend" / "test" / "data" / "light"


def all_models(corpus: Path, big: Path) -> list[ModelRuns]:
    models = [ModelRuns(Path(name).stem, corpus / name, shapes) for name, shapes in CORPUS_SHAPES.items()]
    models += [ModelRuns(f"light_{name}", light_dir() / f"light_{name}.onnx", {}) for name in LIGHT]
    return models + [ModelRuns(BIG, big, {})]


def ensure_big_model(path: Path) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "bench" / "make_big_model.py"), str(path), "--random"],
                       check=True)


# --- measuring a child process ------------------------------------------------------------------------------
#: Children time themselves the way peers.py times the peers: from after ``import onnx`` (interpreter start
#: and onnx's import excluded, the tool's own imports included) to the written file. They print the seconds.
TIMED_MIRSERVE = """import sys, time, json
import onnx
started = time.perf_counter()
from worker.engine.cli import main
status = main(sys.argv[1:])
print(json.dumps({"seconds": time.perf_counter() - started}))
sys.exit(status)
"""
TIMED_LOAD_SAVE = """import sys, time, json
import onnx
started = time.perf_counter()
model = onnx.load(sys.argv[1])
onnx.save(model, sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - started, "nodes": len(model.graph.node)}))
"""
COUNT_NODES = "import onnx, sys; print(len(onnx.load(sys.argv[1], load_external_data=False).graph.node))"


@dataclass
class Child:
    process_seconds: float
    cpu_seconds: float
    peak_mb: float
    status: int
    report: dict | None  # the JSON line the child printed last
    error: str


def measured(command: list[str], timeout: float, cwd: Path = REPO) -> Child:
    """Run ``command`` with its peak RSS read from wait4.

    Linux carries a process's high-water mark across exec, so a child forked from a process holding a model
    reports that process's memory as its own: this process never loads a model (node counts are read in a
    child too) to keep the children's figures their own.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err)
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - started > timeout:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
        tail = (err.read().decode(errors="replace").strip().splitlines() or [""])[-1]
    report = json.loads(lines[-1]) if child.returncode == 0 and lines else None
    return Child(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, child.returncode, report, tail)


def count_nodes(path: Path) -> int:
    done = subprocess.run([sys.executable, "-c", COUNT_NODES, str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def output_bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def max_abs_diff(original: Path, optimized: Path, shapes: dict) -> float | str:
    """Largest absolute difference over all outputs on one seeded random input (mirserve's own checker)."""
    from worker.engine.errors import VerificationError
    from worker.engine.numeric import verify
    try:
        report = verify(str(original), str(optimized), input_shapes=shapes, runs=1, rtol=1e30, atol=1e30)
    except VerificationError as exc:
        return f"error: {str(exc)[:100]}"
    if report.get("passed") is None:
        return f"not run: {report.get('skipped', '')[:80]}"
    return max((o["max_abs_diff"] or 0.0 for o in report["outputs"]), default=0.0)


# --- the tools ----------------------------------------------------------------------------------------------
def run_mirserve(model: ModelRuns, portable: bool, work: Path, timeout: float, check: bool = True) -> Row:
    tool = "mirserve --portable" if portable else "mirserve"
    out = work / f"{model.name}.{'portable' if portable else 'default'}.onnx"
    report = work / "report.json"
    command = [sys.executable, "-c", TIMED_MIRSERVE, "optimize", str(model.path), "-o", str(out), "--no-verify",
               "--quiet", "--report", str(report)] + (["--portable"] if portable else [])
    if model.name.startswith("light_"):  # a few KiB that fold to hundreds of MiB of weights: beyond the output
        command += ["--limit", "max_output_mb=1024"]  # limit that stops such uploads, so raised for these files
    for name, dims in model.shapes.items():
        command += ["--input-shape", f"{name}={','.join(map(str, dims))}"]
    child = measured(command, timeout)
    if child.status != 0 or not out.exists():
        return Row(tool, error=child.error[:160] or f"exit status {child.status}")
    nodes = json.loads(report.read_text())["model"]["output"]["nodes"]
    return Row(tool, nodes, child.report["seconds"], child.peak_mb, output_bytes(out),
               max_abs_diff(model.path, out, model.shapes) if check else None, child.process_seconds,
               child.cpu_seconds)


def run_load_save(model: ModelRuns, work: Path, timeout: float) -> Row:
    out = work / f"{model.name}.load_save.onnx"
    child = measured([sys.executable, "-c", TIMED_LOAD_SAVE, str(model.path), str(out)], timeout)
    if child.status != 0:
        return Row("onnx load+save", error=child.error[:160])
    return Row("onnx load+save", child.report["nodes"], child.report["seconds"], child.peak_mb, output_bytes(out),
               0.0, child.process_seconds, child.cpu_seconds)


def run_peers(model: ModelRuns, peers_script: Path, timeout: float, check: bool = True) -> list[Row]:
    command = [sys.executable, str(peers_script), str(model.path), "--timeout", str(int(timeout))]
    command += [] if check else ["--no-check"]
    for name, dims in model.shapes.items():
        command += ["--shape", f"{name}={','.join(map(str, dims))}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout * (len(PEERS) + 2))
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [Row(peer, error=tail[:160]) for peer in PEERS]
    rows = []
    for entry in json.loads(lines[-1])["rows"]:
        if entry["peer"] == "original":
            rows.append(Row("original", entry["nodes"], bytes=entry["bytes"]))
        elif "error" in entry:
            rows.append(Row(entry["peer"], error=entry["error"]))
        else:
            rows.append(Row(entry["peer"], entry["nodes"], entry["seconds"], entry["peak_rss_mb"], entry["bytes"],
                            entry.get("max_abs_diff")))
    return rows


# --- goals --------------------------------------------------------------------------------------------------
def _ok(row: Row | None) -> bool:
    return row is not None and row.error is None and row.nodes is not None


def goals(model: ModelRuns) -> list[tuple[bool | None, str]]:
    """The issue's done-when figures for one model: (met, sentence); met is None when nothing compares."""
    rows, found = model.rows, []
    portable, default = rows.get("mirserve --portable"), rows.get("mirserve")
    basic = [rows[p] for p in ("onnxoptimizer", "onnxsim", "onnxslim", "ort_basic") if _ok(rows.get(p))]
    if _ok(portable) and basic:
        best = min(basic, key=lambda r: r.nodes)
        found.append((portable.nodes <= best.nodes, f"--portable {portable.nodes} nodes vs the smallest peer "
                                                    f"{best.nodes} ({best.tool})"))
    if _ok(default) and _ok(rows.get("ort_extended")):
        extended = rows["ort_extended"].nodes
        found.append((default.nodes <= extended, f"default {default.nodes} nodes vs ort_extended {extended}"))
    ours = [r for r in (portable, default) if _ok(r)]
    for peer in ("onnxsim", "onnxslim"):
        if rows.get(peer) is not None and rows[peer].error:
            found.append((None, f"{peer} failed on this model, nothing to compare the time with"))
        elif ours and _ok(rows.get(peer)):
            slowest = max(r.seconds for r in ours)
            found.append((slowest < rows[peer].seconds, f"mirserve {slowest:.2f} s (slower mode) vs {peer} "
                                                        f"{rows[peer].seconds:.2f} s"))
    plain = rows.get("onnx load+save")
    if model.name == BIG and _ok(plain) and ours:
        size_mb = model.path.stat().st_size / 2**20
        slowest, peak = max(r.seconds for r in ours), max(r.peak_mb for r in ours)
        found.append((slowest <= 1.5 * plain.seconds, f"mirserve {slowest:.2f} s vs 1.5 x load+save "
                                                       f"{1.5 * plain.seconds:.2f} s"))
        found.append((peak <= 1.5 * size_mb, f"mirserve peak RSS {peak:.0f} MiB vs 1.5 x model size "
                                              f"{1.5 * size_mb:.0f} MiB"))
    return found


# --- output -------------------------------------------------------------------------------------------------
ORDER = ["original", "onnx load+save", "onnxoptimizer", "onnxsim", "onnxslim", "ort_basic", "ort_extended",
         "mirserve --portable", "mirserve"]


def _size(count: int | None) -> str:
    if count is None:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _diff(value) -> str:
    if value is None:
        return ""
    return value.replace("|", "/")[:60] if isinstance(value, str) else f"{value:.2g}"


def table(models: list[ModelRuns], cpu: bool = False) -> str:
    """``cpu``: the whole child's CPU seconds in the ``(process s)`` column instead of its wall seconds."""
    lines = [f"| model | tool | nodes | wall s | ({'cpu' if cpu else 'process'} s) | peak RSS MiB | output | "
             f"max abs diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for model in models:
        first = True
        for tool in ORDER:
            row = model.rows.get(tool)
            if row is None:
                continue
            name = model.name if first else ""
            first = False
            if row.error:
                lines.append(f"| {name} | {tool} | failed: {row.error.replace('|', '/')[:100]} | | | | | |")
                continue
            seconds = "" if row.seconds is None else f"{row.seconds:.2f}"
            peak = "" if row.peak_mb is None else f"{row.peak_mb:.0f}"
            whole = row.cpu_seconds if cpu else row.process_seconds
            process = "" if whole is None else f"({whole:.2f})"
            lines.append(f"| {name} | {tool} | {row.nodes} | {seconds} | {process} | {peak} | {_size(row.bytes)} "
                         f"| {_diff(row.diff)} |")
    return "\n".join(lines)


def goal_lines(models: list[ModelRuns]) -> list[str]:
    lines = []
    for model in models:
        for met, sentence in goals(model):
            verdict = "n/a" if met is None else "met" if met else "**MISSED**"
            lines.append(f"- {verdict} · {model.name}: {sentence}")
    return lines


def machine() -> str:
    from importlib.metadata import version
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    ram = next((int(line.split()[1]) / 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0.0)
    packages = ", ".join(f"{p} {version(p)}" for p in ("onnx", "onnxruntime", "onnxoptimizer", "onnxsim",
                                                       "onnxslim", "numpy"))
    return (f"{cpu}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}; {packages}")


NOTES = [
    "Nodes: top-level nodes of the output (If/Loop bodies not counted).",
    "Wall s: every tool runs in its own child process, timed as `peers.py` times the peers: from after "
    "`import onnx` to the written file, the tool's own imports included. `(process s)` is the whole mirserve "
    "or load+save child, interpreter start included. mirserve runs with `--no-verify`. With `--repeat N` "
    "every tool runs N times, interleaved, and the table shows the median (peak RSS: the largest). The "
    "script compiles mirserve's bytecode first, as pip compiled the peers' when it installed them.",
    "Peak RSS: each child's own maximum resident set (wait4 for mirserve and load+save, getrusage in the child "
    "for the peers). Linux carries a process's high-water mark across exec, so a child reports at least the "
    "memory of the process that started it: this script never loads a model itself, but peers.py loads and "
    "runs the model before it starts each peer, so on the large model the peers' figures include that.",
    "Max abs diff: largest difference from the input model over all outputs, onnxruntime with graph "
    "optimizations off, one seeded random input (the peers' from peers.py, mirserve's from its own checker). "
    "The tests check every model on three inputs at rtol 1e-4 / atol 1e-5. peers.py cannot run onnxruntime's "
    "own output for the light models (`Required inputs ...`: the shape tensors of their ConstantOfShape "
    "weights become graph inputs), so those cells hold its error.",
    "The light models compute their weights with ConstantOfShape, so their outputs barely depend on the "
    f"input; `{BIG}` is VGG-19 with 548 MB of random float32 weights (`bench/make_big_model.py --random`).",
]


def markdown(models: list[ModelRuns], command: str) -> str:
    return "\n".join([
        "# Benchmark: mirserve and the peer ONNX optimizers", "",
        f"Command (from the repository root): `{command}`", "",
        f"Machine: {machine()}", "",
        f"Run: {time.strftime('%Y-%m-%d %H:%M %Z')}, git {_git_head()}", "",
        *[f"- {note}" for note in NOTES], "",
        table(models), "", "## Goals (issue 3, done-when)", "", *goal_lines(models), "",
    ])


def _git_head() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


# --- main ---------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="model name (repeatable), e.g. light_resnet50")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers (quick mirserve figures)")
    parser.add_argument("--corpus", type=Path, default=Path(os.environ.get("MIRSERVE_CORPUS") or sibling("corpus")))
    parser.add_argument("--peers-script", type=Path, default=sibling("bench", "peers.py"))
    parser.add_argument("--big-model", type=Path, default=Path(tempfile.gettempdir()) / "mirserve-bench" /
                        "vgg19_random.onnx", help="where the 575 MB VGG-19 is (built there when missing)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per tool run")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run every tool N times and report the median wall time (the machine is shared)")
    parser.add_argument("--markdown", type=Path, help="also write the table, command and machine here")
    parser.add_argument("--cpu", action="store_true",
                        help="show each mirserve and load+save child's CPU seconds (user + system, median of the "
                             "repeats) instead of its process wall seconds: steadier on a busy machine")
    args = parser.parse_args()
    if not args.corpus.is_dir():
        parser.error(f"the model corpus is not at {args.corpus}: pass --corpus or set MIRSERVE_CORPUS")
    if not args.no_peers and not args.peers_script.is_file():
        parser.error(f"peers.py is not at {args.peers_script}: pass --peers-script or --no-peers")
    # An installed mirserve has its bytecode compiled, as pip compiles the peers' at install time; a checkout
    # run with PYTHONDONTWRITEBYTECODE set would compile every module again in every child.
    for package in ("worker", "app"):
        compileall.compile_dir(str(REPO / package), quiet=1)
    models = [m for m in all_models(args.corpus, args.big_model) if not args.only or m.name in args.only]
    if any(m.name == BIG for m in models):
        ensure_big_model(args.big_model)
    with tempfile.TemporaryDirectory(prefix="mirserve-bench-") as tmp:
        for model in models:
            measure_model(model, Path(tmp), args)
            print(f"{model.name}: done", file=sys.stderr, flush=True)
    report = table(models, cpu=args.cpu) + "\n\n" + "\n".join(goal_lines(models))
    print(report)
    if args.markdown:
        from worker.engine.atomic import atomic_path
        command = "python bench/compare.py " + " ".join(sys.argv[1:])
        kept = kept_sections(args.markdown)
        with atomic_path(args.markdown) as target:
            target.write_text(markdown(models, command.strip()) + kept)


#: Sections of BENCHMARKS.md that other bench scripts write (bench/transformer_bench.py, then
#: bench/placement_costs.py after it): kept as they are, from the first of them to the end.
KEPT_SECTION = "\n## Transformer exports"


def kept_sections(path: Path) -> str:
    text = path.read_text() if path.exists() else ""
    start = text.find(KEPT_SECTION)
    return "" if start < 0 else "\n" + text[start:]


def measure_model(model: ModelRuns, work: Path, args) -> None:
    """Every tool ``args.repeat`` times, interleaved; the first run's figures with the median wall time."""
    runs: dict[str, list[Row]] = {}
    for attempt in range(args.repeat):
        first = attempt == 0
        rows = [] if args.no_peers else run_peers(model, args.peers_script, args.timeout, check=first)
        if args.no_peers and first:
            rows.append(Row("original", count_nodes(model.path), bytes=output_bytes(model.path)))
        rows.append(run_load_save(model, work, args.timeout))
        rows += [run_mirserve(model, portable, work, args.timeout, check=first) for portable in (True, False)]
        for row in rows:
            runs.setdefault(row.tool, []).append(row)
        for path in work.iterdir():  # the outputs of a 575 MB model add up
            path.unlink()
    model.rows = {tool: _combined(rows) for tool, rows in runs.items()}


def _combined(rows: list[Row]) -> Row:
    """The first run, with the median of the wall times and the largest peak of the runs that worked."""
    first, done = rows[0], [r for r in rows if r.error is None and r.seconds is not None]
    if first.error is None and done:
        first.seconds = statistics.median(r.seconds for r in done)
        first.peak_mb = max(r.peak_mb for r in done)
        if first.process_seconds is not None:
            first.process_seconds = statistics.median(r.process_seconds for r in done)
            first.cpu_seconds = statistics.median(r.cpu_seconds for r in done)
    return first


if __name__ == "__main__":
    main()
