"""Sweep mirserve over the transformers exports of ``transformer_exports.py`` under every place configuration of
``vision_exports.CONFIGS`` (default, arm, opencl, npu, portable, arm_L1), with the vision sweep's own machinery
(``vision_exports.sweep``: one child ``mirserve optimize --json`` per run, the peers once per model, results kept
in ``--out``/sweep.json so an interrupted sweep resumes; ``vision_exports.report``: the table and the failures).

Run with the project's environment, after exporting with the torch one:

    .venv/bin/python bench/transformer_sweep.py [--only NAME ...] [--third | --fourth | --fifth | --sixth | --seventh] [--exporter dynamo|torchscript] [--config NAME ...]
        [--exports DIR] [--out DIR] [--force] [--no-peers] [--timeout S] [--mirserve-tree DIR]
    .venv/bin/python bench/transformer_sweep.py --table [--out DIR]

The exports are read from ``--exports`` (default ``bench/out/transformers``); the results go to ``--out`` (default
``bench/out/transformers/sweep``, its sweep.json). Exit status 1 when any failure is listed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vision_exports  # noqa: E402
from transformer_exports import (EXPORTERS, MODELS, OUT, fifth_models, fourth_models, seventh_models,  # noqa: E402
                                 sixth_models, third_models)  # (imports no torch)

REPO = vision_exports.REPO


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(MODELS), help="this model (repeatable)")
    parser.add_argument("--exporter", action="append", choices=EXPORTERS, help="only this exporter")
    parser.add_argument("--third", action="store_true", help="only the third sweep's batch (third_models)")
    parser.add_argument("--fourth", action="store_true", help="only the fourth sweep's batch (fourth_models)")
    parser.add_argument("--fifth", action="store_true", help="only the fifth sweep's batch (fifth_models)")
    parser.add_argument("--sixth", action="store_true", help="only the sixth sweep's batch (sixth_models)")
    parser.add_argument("--seventh", action="store_true", help="only the seventh sweep's batch (seventh_models)")
    parser.add_argument("--config", action="append", choices=list(vision_exports.CONFIGS),
                        help="only this configuration")
    parser.add_argument("--exports", type=Path, default=OUT, help="the directory of the exports")
    parser.add_argument("--out", type=Path, default=OUT / "sweep", help="where sweep.json is kept")
    parser.add_argument("--force", action="store_true", help="run again even if done")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mirserve run")
    parser.add_argument("--mirserve-python", type=Path, default=REPO / ".venv" / "bin" / "python")
    parser.add_argument("--peers-python", type=Path, default=vision_exports.PEERS_PYTHON)
    parser.add_argument("--mirserve-tree", type=Path, default=REPO, help="the mirserve source tree to run")
    parser.add_argument("--table", action="store_true", help="only print the table and failures of sweep.json")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table:
        batch = (third_models() if args.third else fourth_models() if args.fourth else fifth_models() if args.fifth
                 else sixth_models() if args.sixth else seventh_models() if args.seventh else MODELS)
        names = args.only or list(batch)
        exporters = args.exporter or list(EXPORTERS)
        models = [path for name in names for exporter in exporters
                  if (path := args.exports / f"{name}.{exporter}.onnx").exists()]
        vision_exports.sweep(models, args.config or list(vision_exports.CONFIGS), args.out, args.force,
                             not args.no_peers, args.timeout, args.mirserve_python, args.peers_python,
                             args.mirserve_tree.resolve())
    return vision_exports.report(args.out)


if __name__ == "__main__":
    sys.exit(main())
