"""What onnxruntime's spinning intra-op threads cost the engine's sessions (worker/engine/runtime.py).

For each model: one session per setting (spinning on, as onnxruntime does by default; off, as the engine
opens its sessions), ``--runs`` runs of seeded inputs, wall seconds and CPU seconds (user + system of this
process, which holds the session's threads), best of ``--repeat``. Each model is measured on the machine as
it is and again with ``--busy`` processes spinning on the CPU beside it, as a worker's other jobs or a second
test process would; a loaded machine is where a spinning thread takes a core from the work.

    .venv/bin/python bench/ort_spinning.py [--runs 5] [--repeat 3] [--busy 1] [MODEL.onnx ...]

Without models: the corpus's PP-OCRv4 detector and BERT, and onnx's ResNet-50 and DenseNet-121.
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import CORPUS, LIGHT, random_feeds, shapes_for  # noqa: E402
from worker.engine.runtime import cpu_session, session_options  # noqa: E402

DEFAULT_MODELS = [CORPUS / "ch_PP-OCRv4_det_infer.onnx", CORPUS / "bert_small_dyn.onnx",
                  LIGHT / "light_resnet50.onnx", LIGHT / "light_densenet121.onnx"]


def _spin_forever() -> None:
    while True:
        pass


def measure(path: Path, spinning: bool, runs: int, repeat: int) -> tuple[float, float]:
    """Best (wall seconds, CPU seconds) over ``repeat`` of: open a session, ``runs`` runs."""
    feeds = random_feeds(path, shapes_for(path))
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        options = session_options(spinning=spinning)
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        session = cpu_session(str(path), options)
        for _ in range(runs):
            session.run(None, feeds)
        del session
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        best = min(best, (time.perf_counter() - started, cpu))
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--busy", type=int, default=1, help="spinning processes beside the loaded measurement")
    args = parser.parse_args(argv)
    models = args.models or DEFAULT_MODELS
    print(f"{'model':<34} {'machine':<8} {'spin wall':>9} {'no-spin wall':>12} {'spin CPU':>9} {'no-spin CPU':>11}")
    for load in ("idle", "busy"):
        busy = [multiprocessing.Process(target=_spin_forever, daemon=True)
                for _ in range(args.busy if load == "busy" else 0)]
        for process in busy:
            process.start()
        try:
            for path in models:
                on = measure(path, True, args.runs, args.repeat)
                off = measure(path, False, args.runs, args.repeat)
                print(f"{path.stem:<34} {load:<8} {on[0]:9.3f} {off[0]:12.3f} {on[1]:9.3f} {off[1]:11.3f}")
        finally:
            for process in busy:
                process.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
