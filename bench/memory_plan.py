"""How long memory planning takes on a BERT-base-size graph (goal: at most 0.5 s), and how good the plan is.

    /work/main/.venv/bin/python bench/memory_plan.py [--repeat 5]

Prints, for the 12-layer BERT-base graph of bench/bert_base_graph.py (batch 1, sequence 128) and for a
synthetic set of 4000 buffers: node and buffer counts, liveness and planning seconds (best of --repeat), the
ordering kept, arena / lower bound, and the Paddle-Lite-style figure. "all orderings" times the planner with
the early stop disabled, the worst case.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bert_base_graph import bert_base_model  # noqa: E402
from worker.memory import Buffer, Step, ValueFacts, analyze, plan_arena  # noqa: E402


def steps_and_facts(model: onnx.ModelProto) -> tuple[list[Step], dict[str, ValueFacts]]:
    """Plain liveness input from a shape-inferred ModelProto (stand-in until the IR pass is used)."""
    graph = model.graph
    roles = {v.name: "graph input" for v in graph.input}
    roles.update({t.name: "initializer" for t in graph.initializer})
    roles.update({v.name: "graph output" for v in graph.output})
    facts = {}
    for info in [*graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
        nbytes = None if None in shape else int(np.prod(shape, dtype=np.int64)) * itemsize
        facts[info.name] = ValueFacts(info.name, nbytes, tensor.elem_type, shape, "host", roles.get(info.name))
    steps = [Step(n.name, n.op_type, tuple(n.input), tuple(n.output), n.domain) for n in graph.node]
    return steps, facts


def best_time(function, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


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


def report(label: str, buffers: list[Buffer], steps: int, repeat: int, prep: float | None = None) -> None:
    seconds, plan = best_time(lambda: plan_arena("host", buffers, steps), repeat)
    all_seconds, _ = best_time(lambda: _all_orderings(buffers), repeat)
    print(f"{label}: {steps} steps, {len(buffers)} buffers")
    if prep is not None:
        print(f"  liveness (in-place merging)  {prep * 1000:8.1f} ms")
    print(f"  planning                     {seconds * 1000:8.1f} ms  (ordering kept: {plan.ordering})")
    print(f"  planning, all orderings      {all_seconds * 1000:8.1f} ms")
    print(f"  lower bound {plan.lower_bound_bytes:,} B, arena {plan.arena_bytes:,} B, "
          f"ratio {plan.ratio:.4f}; Paddle-Lite-style {plan.paddle_lite_style_bytes:,} B "
          f"({plan.paddle_lite_style_bytes / max(plan.lower_bound_bytes, 1):.3f} x bound)")


def _all_orderings(buffers: list[Buffer]):
    """Every ordering, no early stop: what planning costs when the first ordering misses the bound."""
    from worker.memory.planner import ORDERINGS, place_in_order
    return [place_in_order(sorted(buffers, key=key)) for key in ORDERINGS.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    model = bert_base_model()
    steps, facts = steps_and_facts(model)
    prep, liveness = best_time(lambda: analyze(steps, facts), args.repeat)
    buffers = [interval.to_buffer() for interval in liveness.intervals]
    report(f"BERT-base ({len(model.graph.node)} nodes)", buffers, len(steps), args.repeat, prep)
    report("synthetic", synthetic_buffers(4000), 2000 + 400, args.repeat)


if __name__ == "__main__":
    main()
