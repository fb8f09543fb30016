"""Memory plan figures per real model, mirserve's arena beside the Paddle-Lite-style figure.

    /work/main/.venv/bin/python bench/memory_models.py

Every corpus model and every light model-zoo model, fp32, batch 1, static input shapes, through the default
pipeline. Prints one Markdown table row per arena: lower bound, mirserve's arena, their ratio, the arena
Paddle-Lite's name-order clustering would need on the same intervals (and its ratio to the bound), the
no-reuse total, weights, MACs, and the time the memory_plan pass took.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import all_models, shapes_for  # noqa: E402
from worker.engine.ir import load_model  # noqa: E402
from worker.engine.options import OptimizeOptions  # noqa: E402
from worker.engine.passes import PassContext, PassManager, get_pipeline  # noqa: E402
from worker.engine.inference import apply_input_shapes  # noqa: E402
from worker.engine.places import parse_places  # noqa: E402


def run(path: Path) -> tuple[dict, float]:
    model = load_model(path)
    shapes = {name: [1, *dims[1:]] for name, dims in shapes_for(path).items()}
    options = OptimizeOptions(input_shapes=shapes)
    apply_input_shapes(model.graph, shapes)
    ctx = PassContext(model, options, parse_places(options.places))
    trace = PassManager().run(ctx, get_pipeline("default").steps_for(options))
    seconds = next(e["seconds"] for e in trace if e["pass"] == "memory_plan")
    return ctx.report["memory"], seconds


def mib(count: int) -> str:
    return f"{count / 2 ** 20:.2f}"


def main() -> None:
    print("| model | space | lower bound MiB | mirserve arena MiB | ratio | Paddle-Lite-style MiB | PL / bound "
          "| no reuse MiB | weights MiB | GMACs | plan s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in all_models():
        memory, seconds = run(path)
        weights = sum(memory["weights_bytes"].values())
        for arena in memory["arenas"]:
            paddle = memory["paddle_lite_style_bytes"][arena["space"]]
            bound = arena["lower_bound_bytes"]
            print(f"| {path.stem} | {arena['space']} | {mib(bound)} | {mib(arena['arena_bytes'])} "
                  f"| {arena['ratio']:.4f} | {mib(paddle)} | {paddle / bound:.3f} | {mib(arena['naive_bytes'])} "
                  f"| {mib(weights)} | {_gmacs(memory['macs']['total'])} | {seconds:.3f} |")


def _gmacs(total: int | None) -> str:
    return "unknown" if total is None else f"{total / 1e9:.3f}"


if __name__ == "__main__":
    main()
