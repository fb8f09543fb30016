"""How long memory planning takes on a BERT-base-size graph (goal: at most 0.5 s), and how good the plan is.

    /work/main/.venv/bin/python bench/memory_plan.py [--repeat 5] [--seq 128]

The graph is bench/bert_base_graph.py: 12 layers, hidden 768, about a thousand nodes, batch 1. It is loaded
into the IR and typed by the type_inference pass once; then the memory_plan pass is timed end to end (IR to
steps, sizes, in-place merging, planning, the Paddle-Lite figure, MACs and the report), best of --repeat.
The planner alone is also timed on the same buffers, with the early stop (what the pass does) and with every
ordering run (the worst case), and on a synthetic set of 4000 buffers.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bert_base_graph import bert_base_model  # noqa: E402
from worker.engine.ir import load_model  # noqa: E402
from worker.engine.memory import Buffer, plan_arena  # noqa: E402
from worker.engine.memory.planner import ORDERINGS, place_in_order  # noqa: E402
from worker.engine.options import OptimizeOptions  # noqa: E402
from worker.engine.passes import PassContext, PassManager  # noqa: E402
from worker.engine.places import parse_places  # noqa: E402


def best_time(function, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def typed_context(model: onnx.ModelProto) -> PassContext:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bert_base.onnx"
        onnx.save(model, str(path))
        ir = load_model(path)
    ctx = PassContext(ir, OptimizeOptions(), parse_places())
    PassManager().run(ctx, ["type_inference"])
    return ctx


def synthetic_buffers(count: int, seed: int = 0) -> list[Buffer]:
    """Mostly short-lived activations of mixed sizes plus a few long-lived ones, like a real graph."""
    rng = random.Random(seed)
    buffers = []
    for index in range(count):
        first = rng.randrange(count // 2)
        length = rng.choice([1, 1, 2, 2, 3, 5, 8]) if rng.random() < 0.95 else rng.randrange(20, 400)
        size = 64 * rng.choice([1, 1, 2, 12, 1536, 1536, 6144, 24576])
        buffers.append(Buffer(f"t{index:05d}", size, first, first + length))
    return buffers


def planner_figures(label: str, buffers: list[Buffer], steps: int, repeat: int) -> None:
    seconds, plan = best_time(lambda: plan_arena("host", buffers, steps), repeat)
    every, _ = best_time(lambda: [place_in_order(sorted(buffers, key=k)) for k in ORDERINGS.values()], repeat)
    print(f"{label}: {steps} steps, {len(buffers)} buffers")
    print(f"  planner (stops at the bound)   {seconds * 1000:8.1f} ms  (ordering kept: {plan.ordering})")
    print(f"  planner, every ordering        {every * 1000:8.1f} ms")
    print(f"  lower bound {plan.lower_bound_bytes:,} B, arena {plan.arena_bytes:,} B, ratio {plan.ratio:.4f}; "
          f"Paddle-Lite-style {plan.paddle_lite_style_bytes:,} B "
          f"({plan.paddle_lite_style_bytes / max(plan.lower_bound_bytes, 1):.3f} x the bound)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    ctx = typed_context(bert_base_model(seq=args.seq))
    manager = PassManager()
    seconds, _ = best_time(lambda: manager.run(ctx, ["memory_plan"]), args.repeat)
    entry = manager.trace[-1]
    (arena,) = ctx.report["memory"]["arenas"]
    print(f"BERT-base, sequence {args.seq}: {len(ctx.graph)} nodes, {entry['buffers']} buffers "
          f"({entry['in_place']} in-place writes, {entry['views']} views merged)")
    print(f"  memory_plan pass, end to end   {seconds * 1000:8.1f} ms  (goal: 500 ms)")
    buffers = [v for v in arena["values"]]
    planner_figures("  the same buffers", [Buffer(v["name"], v["size"], v["first"], v["last"]) for v in buffers],
                    len(arena["timeline"]), args.repeat)
    planner_figures("synthetic", synthetic_buffers(4000), 2400, args.repeat)


if __name__ == "__main__":
    main()
