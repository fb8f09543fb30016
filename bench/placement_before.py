"""Casts in the default pipeline's output before issue 12 (the per-node greedy pick and placement-blind
fusions of commit fbf9e4e), the "before" column of bench/placement_costs.py.

    .venv/bin/python bench/placement_before.py [--commit fbf9e4e] [--places P,P]

The commit's tree is extracted with ``git archive`` into a temporary directory and this script runs again
with that tree's engine on the path; it counts the cast nodes (io_copy, calib, layout, own-domain or portable)
in each output model and the bytes they write (output elements times element size, from shape inference).
Prints a JSON object: model name -> [count, bytes].
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMIT = "fbf9e4e"  # main just before the first commit of issue 12 (268f068)
CASTS = ("calib", "layout", "io_copy")


def count_casts(path: Path) -> tuple[int, int]:
    """Cast nodes of an output model and the bytes they write."""
    import numpy as np
    import onnx
    model = onnx.shape_inference.infer_shapes(onnx.load(path, load_external_data=False))
    types = {v.name: v.type.tensor_type for v in [*model.graph.value_info, *model.graph.output]}
    count = size = 0
    for node in model.graph.node:
        own = node.domain == "mirserve" and node.op_type in CASTS
        if not own and not any(p.key == "mirserve.cast" for p in node.metadata_props):
            continue
        tensor = types[node.output[0]]
        count += 1
        size += int(np.prod([d.dim_value for d in tensor.shape.dim])) * \
            onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
    return count, size


def measure(places: str) -> dict:
    """Run with the old tree first on the path: its engine, and its tests.conftest's model lists (the same as
    today's; the corpus directory comes through MIRSERVE_CORPUS, as the tree sits outside the checkout)."""
    from tests.conftest import CORPUS, CORPUS_SHAPES, LIGHT, LIGHT_MODELS
    from worker.engine.api import optimize
    from worker.engine.limits import Limits
    from worker.engine.options import OptimizeOptions
    models = [(n[:-5], CORPUS / n, CORPUS_SHAPES[n]) for n in CORPUS_SHAPES]
    models += [(n, LIGHT / f"{n}.onnx", {}) for n in LIGHT_MODELS]
    found = {}
    with tempfile.TemporaryDirectory() as directory:
        for name, path, shapes in models:
            output = Path(directory) / f"{name}.onnx"
            optimize(path, output, OptimizeOptions(places=places, input_shapes=shapes, verify=False,
                                                   limits=Limits().raised(["max_output_mb=1024"])))
            found[name] = list(count_casts(output))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default=COMMIT)
    parser.add_argument("--places", default="arm/fp16/nhwc,arm/fp32/nchw")
    parser.add_argument("--engine", type=Path, help=argparse.SUPPRESS)  # the re-run with the old tree
    args = parser.parse_args(argv)
    if args.engine is not None:
        print(json.dumps(measure(args.places)))
        return 0
    with tempfile.TemporaryDirectory() as directory:
        archive = subprocess.run(["git", "archive", args.commit], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
        sys.path.insert(0, str(REPO))
        from tests.conftest import CORPUS
        env = {**os.environ, "PYTHONPATH": directory, "MIRSERVE_CORPUS": str(CORPUS)}
        run = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--engine", directory,
                              "--places", args.places], cwd=directory, env=env, capture_output=True, text=True)
        if run.returncode:
            sys.stderr.write(run.stderr)
            return run.returncode
        print(run.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
