"""Placement at the default level against ``--opt-level 1`` (issue 12, "no rewrite may lose placement").

Two steps, in two environments:

- ``export`` (the torch environment, ``/work/bench-env/venv/bin/python``): writes, with random weights and
  nothing downloaded, into ``--out`` (default ``bench/out/placement``, gitignored):
  ``yolo_style.onnx`` (the YOLOv8-style detector of ``detection_exports.py``: Conv-BN-SiLU, static 1x3x320x320),
  ``mobilenet_v3_small.onnx`` (torchvision, HardSwish and HardSigmoid, 1x3x224x224) and
  ``bert_encoder.onnx`` (transformers' BertModel, 2 layers, hidden 64, sequence 16; TorchScript exporter).
- ``table`` (the project's environment, ``.venv/bin/python``): optimizes every exported model, every corpus
  model (../shared/corpus) and, with ``--light``, the onnx light models, under each place set at
  ``--opt-level 1`` and at the default level 2, and prints one row per (model, places): host nodes (casts and
  nodes the placement plan put on host by choice not counted) at level 1 and level 2, casts at each level, and whether level 2 verified. Exit status 1 when some
  level-2 run has more host nodes than level 1 or fails to verify.

Usage:
    /work/bench-env/venv/bin/python bench/placement_exports.py export [--out DIR]
    .venv/bin/python bench/placement_exports.py table [--out DIR] [--light] [--only SUBSTRING ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "placement"
PLACE_SETS = ("arm/fp16/nhwc,arm/fp32/nchw", "opencl/fp16/nchw,arm/fp32/nchw", "npu/int8/nchw,arm/fp32/nchw")
SIZE = 320


# --- export (torch environment) -------------------------------------------------------------------------
def _export_yolo(path: Path) -> None:
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    from detection_exports import _yolo_style

    model = _yolo_style()
    with torch.no_grad():
        torch.onnx.export(model, (torch.rand(1, 3, SIZE, SIZE),), str(path), dynamo=False, opset_version=17,
                          input_names=["images"], output_names=["output"], do_constant_folding=False)


def _export_mobilenet(path: Path) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None).eval()
    for module in model.modules():  # running statistics off their defaults, as a trained model's are
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    with torch.no_grad():
        torch.onnx.export(model, (torch.rand(1, 3, 224, 224),), str(path), dynamo=False, opset_version=17,
                          input_names=["images"], output_names=["logits"])


def _export_bert(path: Path) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import transformer_exports

    transformer_exports.export("bert", "torchscript", path, transformer_exports.SIZES["bench"])


EXPORTS = {"yolo_style": _export_yolo, "mobilenet_v3_small": _export_mobilenet, "bert_encoder": _export_bert}


def export_all(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, build in EXPORTS.items():
        path = out / f"{name}.onnx"
        started = time.perf_counter()
        try:
            build(path)
        except Exception as exc:  # one failed export is reported; the others still run
            failed += 1
            print(f"{name}: export failed: {exc}")
            continue
        print(f"{name}: {path} ({path.stat().st_size:,} bytes, {time.perf_counter() - started:.1f} s)")
    return 1 if failed else 0


# --- table (project environment) ------------------------------------------------------------------------
def models(out: Path, light: bool) -> list[Path]:
    found = sorted(out.glob("*.onnx"))
    corpus = REPO.parent / "shared" / "corpus"
    if not corpus.is_dir():
        corpus = Path("/work/shared/corpus")
    found += sorted(corpus.glob("*.onnx"))
    if light:
        import onnx

        found += sorted((Path(onnx.__file__).parent / "backend" / "test" / "data" / "light").glob("*.onnx"))
    return found


def placement(model: Path, places: str, level: int) -> dict:
    """Host nodes (not casts), casts, and the verification verdict of one run; ``error`` when it failed."""
    from worker.engine.api import optimize
    from worker.engine.errors import MirserveError
    from worker.engine.options import OptimizeOptions

    with tempfile.TemporaryDirectory() as tmp:
        try:
            report = optimize(model, Path(tmp) / "out.onnx", OptimizeOptions(places=places, opt_level=level))
        except MirserveError as exc:
            return {"error": str(exc).splitlines()[0][:160]}
    return host_figures(report)


def host_figures(report: dict) -> dict:
    summary = report["summary"]
    # nodes the placement plan put on host by choice (a listed place runs them, casts cost more) not counted
    host = sum(f["nodes"] for f in summary["host_fallbacks"] if f.get("kind") != "plan")
    return {"host": host, "casts": sum((summary.get("casts") or {}).values()),
            "verified": (report.get("verification") or {}).get("passed")}


def table(out: Path, light: bool, only: list[str]) -> int:
    bad = 0
    print(f"{'model':40} {'places':32} {'host L1':>7} {'host L2':>7} {'casts L1':>8} {'casts L2':>8} verified")
    for model in models(out, light):
        if only and not any(s in model.name for s in only):
            continue
        for places in PLACE_SETS:
            one, two = placement(model, places, 1), placement(model, places, 2)
            if "error" in one or "error" in two:
                print(f"{model.stem[:40]:40} {places:32} L1: {one.get('error', 'ok')} | L2: {two.get('error', 'ok')}")
                bad += "error" in two and "error" not in one
                continue
            worse = two["host"] > one["host"] or two["verified"] is False
            bad += worse
            print(f"{model.stem[:40]:40} {places:32} {one['host']:>7} {two['host']:>7} {one['casts']:>8} "
                  f"{two['casts']:>8} {two['verified']}{'  <-- worse' if worse else ''}", flush=True)
    return 1 if bad else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("export", "table"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--light", action="store_true", help="also the onnx light models")
    parser.add_argument("--only", action="append", default=[], help="models whose name contains this")
    args = parser.parse_args(argv)
    if args.step == "export":
        return export_all(args.out)
    sys.path.insert(0, str(REPO))
    return table(args.out, args.light, args.only)


if __name__ == "__main__":
    sys.exit(main())
