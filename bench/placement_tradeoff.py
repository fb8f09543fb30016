"""What fewer cast bytes would cost: the exact plans that minimise cost + lambda x cast bytes (issue 12).

    .venv/bin/python bench/placement_tradeoff.py [--model NAME] [--places P,P] [--bytes B]

static_kernel_pick's problem for the model (default pipeline, level 2) is solved exhaustively by
pick_frontier's dynamic programming with each cast byte weighted lambda units more, for a range of lambda: each
line is a plan on the lower convex hull of (cast bytes, cost). With ``--bytes B`` (a cap on cast bytes, e.g.
half of the casts before issue 12) it prints the Lagrangian bound: no choice of kernels whose casts write at
most B bytes costs less than max over lambda of (min(cost + lambda x bytes) - lambda x B).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import CORPUS, CORPUS_SHAPES  # noqa: E402
from tests.engine.passes.place.helpers import place_model  # noqa: E402
from worker.engine.passes.place import static_kernel_pick as pick_pass  # noqa: E402
from worker.engine.passes.support import pick_frontier, pick_plan  # noqa: E402

LAMBDAS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 20.0, 1000.0)


class Weighted(pick_plan.Problem):
    """The plan's problem with every cast byte costing ``weight`` units more."""

    weight = 0.0

    def flow_casts(self, index, source, demands):
        cost, casts, count, size = super().flow_casts(index, source, demands)
        return cost + self.weight * size, casts, count, size


def problem_of(name: str, places: str) -> tuple[pick_plan.Problem, dict]:
    problems, solve = [], pick_pass.search.solve

    def kept(problem, greedy):
        problems.append(problem)
        return solve(problem, greedy)
    pick_pass.search.solve = kept
    try:
        ctx = place_model(CORPUS / name, places, shapes=CORPUS_SHAPES[name], verify_ir=False)
    finally:
        pick_pass.search.solve = solve
    return problems[-1], ctx.report["placement"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ch_ppocr_mobile_v2.0_cls_infer.onnx")
    parser.add_argument("--places", default="arm/fp16/nhwc,arm/fp32/nchw")
    parser.add_argument("--bytes", type=int, help="a cap on cast bytes: print the least cost any plan under it has")
    args = parser.parse_args(argv)
    problem, figures = problem_of(args.model, args.places)
    print(f"{args.model} under {args.places}: {len(problem.nodes)} nodes; the pipeline's plan costs "
          f"{figures['cost']:,.1f} with {figures['casts']['count']} casts / {figures['casts']['bytes']:,} B")
    weighted = Weighted(problem.nodes, problem.options, problem.flows, problem.model)
    hull = []
    for weight in LAMBDAS:
        weighted.weight, weighted._memo = weight, {}
        found = pick_frontier.solve_frontier(weighted, float("inf"))
        if found is None:
            print("the graph has no finite plan")
            return 1
        choice, value = found
        count, size = problem.cast_load(choice)
        places: dict[str, int] = {}
        for node, option in enumerate(choice):
            place = "/".join(getattr(part, "value", part) for part in problem.options[node][option].place)
            places[place] = places.get(place, 0) + 1
        hull.append((weight, value))
        print(f"lambda {weight:>7}: cost {problem.total(choice):,.1f}, {count} casts / {size:,} B; nodes per "
              f"place {dict(sorted(places.items()))}")
    if args.bytes is not None:
        bound = max(value - weight * args.bytes for weight, value in hull)
        print(f"no plan whose casts write at most {args.bytes:,} B costs less than {bound:,.1f} "
              f"({bound - figures['cost']:+,.1f} against the plan)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
