"""Export torchvision detection and segmentation models and a YOLO-style detector (random weights, nothing
downloaded) to ONNX, then optimize each with mirserve without --input-shape and compare node counts with the
peers.

Exports (TorchScript exporter, ``dynamo=False``), into bench/out/ (gitignored):
- ``ssdlite320_mobilenet_v3_large`` and ``fasterrcnn_mobilenet_v3_large_320_fpn``: static 1x3x320x320, the
  exports whose empty constants (a Cast of an int64 [0]) crashed constant folding;
- the same two with dynamic height and width (``*_dynamic.onnx``);
- ``lraspp_mobilenet_v3_large`` and ``deeplabv3_mobilenet_v3_large`` segmentation with dynamic batch, height
  and width;
- ``yolo_style``: a YOLOv8-style network built here (Conv-BN-SiLU, C2f blocks, SPPF, an upsampling FPN, a
  decoupled head decoding boxes on grids made from the feature maps' shapes), dynamic batch, height, width.

Run with the torch environment (``/work/bench-env/venv/bin/python bench/detection_exports.py``); mirserve runs
in its own child (``--mirserve-python``, default the project's .venv) and the peers through
``../shared/bench/peers.py`` under ``--peers-python`` (a Python with onnxsim, onnxslim, onnxoptimizer).
Prints one line per model: mirserve's result and node count, and each peer's.

Usage: python bench/detection_exports.py [--only NAME ...] [--skip-export] [--no-peers]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
PEERS_SCRIPT = REPO.parent / "shared" / "bench" / "peers.py"
if not PEERS_SCRIPT.exists():
    PEERS_SCRIPT = REPO.parents[1] / "shared" / "bench" / "peers.py"
SIZE = 320


def _torchvision_detection(name: str):
    import torchvision

    builder = getattr(torchvision.models.detection, name)
    model = builder(weights=None, weights_backbone=None)
    return model.eval()


def _segmentation(name: str):
    import torchvision

    builder = getattr(torchvision.models.segmentation, name)
    kwargs = {"weights": None, "weights_backbone": None}
    if name.startswith("deeplabv3"):
        kwargs["aux_loss"] = False
    return builder(**kwargs).eval()


def _yolo_style():
    """A YOLOv8-shaped detector: what the dynamic-shape handling has to get right (Resize by a scale, grids
    from Shape, concatenated multi-scale outputs)."""
    import torch
    from torch import nn

    def conv(c_in, c_out, k=1, s=1):
        return nn.Sequential(nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False), nn.BatchNorm2d(c_out), nn.SiLU())

    class C2f(nn.Module):
        def __init__(self, c_in, c_out, n=1):
            super().__init__()
            self.hidden = c_out // 2
            self.cv1, self.cv2 = conv(c_in, 2 * self.hidden), conv((2 + n) * self.hidden, c_out)
            self.blocks = nn.ModuleList(nn.Sequential(conv(self.hidden, self.hidden, 3), conv(self.hidden, self.hidden, 3))
                                        for _ in range(n))

        def forward(self, x):
            parts = list(self.cv1(x).chunk(2, 1))
            for block in self.blocks:
                parts.append(parts[-1] + block(parts[-1]))
            return self.cv2(torch.cat(parts, 1))

    class SPPF(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.cv1, self.cv2, self.pool = conv(c, c // 2), conv(c * 2, c), nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            x = self.cv1(x)
            y1 = self.pool(x)
            y2 = self.pool(y1)
            return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))

    class Detect(nn.Module):
        def __init__(self, channels, classes=4, reg=8):
            super().__init__()
            self.reg, self.classes = reg, classes
            self.box = nn.ModuleList(nn.Sequential(conv(c, 32, 3), nn.Conv2d(32, 4 * reg, 1)) for c in channels)
            self.cls = nn.ModuleList(nn.Sequential(conv(c, 32, 3), nn.Conv2d(32, classes, 1)) for c in channels)
            self.register_buffer("bins", torch.arange(reg, dtype=torch.float32))

        def forward(self, features):
            outputs = []
            for k, x in enumerate(features):
                b, _, h, w = x.shape
                stride = 8 * 2 ** k
                box = self.box[k](x).view(b, 4, self.reg, h * w).softmax(2)
                dist = (box * self.bins.view(1, 1, -1, 1)).sum(2)  # DFL: the expected bin
                ys = torch.arange(h, dtype=torch.float32) + 0.5
                xs = torch.arange(w, dtype=torch.float32) + 0.5
                grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
                anchors = torch.stack([grid_x, grid_y], 0).view(1, 2, h * w)
                xy1, xy2 = anchors - dist[:, :2], anchors + dist[:, 2:]
                scores = self.cls[k](x).view(b, self.classes, h * w).sigmoid()
                outputs.append(torch.cat([torch.cat([xy1, xy2], 1) * stride, scores], 1))
            return torch.cat(outputs, 2)

    class YoloStyle(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(conv(3, 16, 3, 2), conv(16, 32, 3, 2), C2f(32, 32))
            self.p3 = nn.Sequential(conv(32, 64, 3, 2), C2f(64, 64))
            self.p4 = nn.Sequential(conv(64, 96, 3, 2), C2f(96, 96))
            self.p5 = nn.Sequential(conv(96, 128, 3, 2), C2f(128, 128), SPPF(128))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.n4, self.n3 = C2f(128 + 96, 96), C2f(96 + 64, 64)
            self.down3, self.m4 = conv(64, 64, 3, 2), C2f(64 + 96, 96)
            self.down4, self.m5 = conv(96, 96, 3, 2), C2f(96 + 128, 128)
            self.detect = Detect((64, 96, 128))

        def forward(self, x):
            p3 = self.p3(self.stem(x))
            p4 = self.p4(p3)
            p5 = self.p5(p4)
            n4 = self.n4(torch.cat([self.up(p5), p4], 1))
            n3 = self.n3(torch.cat([self.up(n4), p3], 1))
            m4 = self.m4(torch.cat([self.down3(n3), n4], 1))
            m5 = self.m5(torch.cat([self.down4(m4), p5], 1))
            return self.detect([n3, m4, m5])

    torch.manual_seed(0)
    model = YoloStyle().eval()
    for module in model.modules():  # running statistics off their defaults, as a trained model's are
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return model


#: name -> (builder, dynamic axes of input "images" (None: static), outputs' names)
EXPORTS = {
    "ssdlite320_mobilenet_v3_large": (lambda: _torchvision_detection("ssdlite320_mobilenet_v3_large"), None),
    "fasterrcnn_mobilenet_v3_large_320_fpn":
        (lambda: _torchvision_detection("fasterrcnn_mobilenet_v3_large_320_fpn"), None),
    "ssdlite320_mobilenet_v3_large_dynamic":
        (lambda: _torchvision_detection("ssdlite320_mobilenet_v3_large"), {1: "height", 2: "width"}),
    "fasterrcnn_mobilenet_v3_large_320_fpn_dynamic":
        (lambda: _torchvision_detection("fasterrcnn_mobilenet_v3_large_320_fpn"), {1: "height", 2: "width"}),
    "lraspp_mobilenet_v3_large_dynamic":
        (lambda: _segmentation("lraspp_mobilenet_v3_large"), {0: "batch", 2: "height", 3: "width"}),
    "deeplabv3_mobilenet_v3_large_dynamic":
        (lambda: _segmentation("deeplabv3_mobilenet_v3_large"), {0: "batch", 2: "height", 3: "width"}),
    "yolo_style_dynamic": (_yolo_style, {0: "batch", 2: "height", 3: "width"}),
}


def export(name: str, path: Path) -> None:
    import torch

    build, axes = EXPORTS[name]
    torch.manual_seed(0)
    model = build()
    detection = "rcnn" in name or "ssd" in name
    image = torch.rand(1, 3, SIZE, SIZE)
    inputs = ([image[0]],) if detection else (image,)
    with torch.no_grad():
        torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17, input_names=["images"],
                          dynamic_axes={"images": axes} if axes else None, do_constant_folding=False)


def optimize(path: Path, python: Path) -> dict:
    out = path.with_suffix(".mirserve.onnx")
    report = path.with_suffix(".report.json")
    started = time.perf_counter()
    child = subprocess.run([str(python), "-m", "app.cli", "optimize", str(path), "-o", str(out), "--report",
                            str(report), "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    seconds = round(time.perf_counter() - started, 1)
    if child.returncode != 0:
        return {"error": (child.stderr.strip().splitlines() or ["?"])[-1][:300], "seconds": seconds}
    data = json.loads(report.read_text())
    verification = data.get("verification") or {}
    return {"nodes_before": data["model"]["input"]["nodes"], "nodes": data["model"]["output"]["nodes"],
            "seconds": seconds, "verified": verification.get("passed"), "shapes": verification.get("shapes"),
            "max_abs_diff": max((o.get("max_abs_diff") or 0.0 for o in verification.get("outputs", [])), default=None)}


def peers(path: Path, python: Path) -> dict:
    child = subprocess.run([str(python), str(PEERS_SCRIPT), str(path), "--only", "onnxsim", "--only", "onnxslim",
                            "--no-check"], capture_output=True, text=True, timeout=1800)
    if child.returncode != 0:
        return {"error": (child.stderr.strip().splitlines() or ["?"])[-1][:200]}
    rows = json.loads(child.stdout.strip().splitlines()[-1])["rows"]
    return {r["peer"]: r.get("nodes", r.get("error")) for r in rows if r["peer"] != "original"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(EXPORTS))
    parser.add_argument("--skip-export", action="store_true", help="use the files already in bench/out/")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--mirserve-python", type=Path, default=REPO / ".venv" / "bin" / "python")
    parser.add_argument("--peers-python", type=Path, default=REPO / ".venv" / "bin" / "python")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    failed = False
    for name in args.only or EXPORTS:
        path = OUT / f"{name}.onnx"
        if not args.skip_export or not path.exists():
            export(name, path)
        result = optimize(path, args.mirserve_python)
        line = f"{name}: "
        if "error" in result:
            failed = True
            line += f"mirserve FAILED after {result['seconds']} s: {result['error']}"
        else:
            line += (f"mirserve {result['nodes_before']} -> {result['nodes']} nodes in {result['seconds']} s, "
                     f"verified {result['verified']} at {result['shapes']} (max abs diff {result['max_abs_diff']})")
        if not args.no_peers:
            found = peers(path, args.peers_python)
            line += "; " + ", ".join(f"{peer} {nodes}" for peer, nodes in found.items())
            fewer = all(isinstance(n, int) and "nodes" in result and result["nodes"] < n for n in found.values())
            line += " (mirserve has fewer)" if fewer else " (mirserve does NOT have fewer)"
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
