"""Export models with control flow (If, Loop, Scan, sequences) to ONNX and sweep mirserve over them.

Two subcommands, each for its own Python:

- ``export`` (the torch environment, ``/work/bench-env/venv/bin/python``): random weights
  (``torch.manual_seed(0)``), nothing downloaded; each model with the TorchScript exporter (``dynamo=False``,
  opset 17) and, where it works, ``dynamo=True`` (``*_dynamo.onnx``). Writes ``MODELS/<name>.onnx`` and
  ``MODELS/index.json`` (per file: its dynamic inputs, feeds kind).
- ``sweep`` (the project's venv, ``.venv/bin/python``; needs only onnx, onnxruntime, numpy): for every export,
  ``mirserve optimize`` in a child process under several place sets (and with/without ``--input-shape`` for
  the dynamic ones), then feeds the optimized model 3 real-looking inputs with onnxruntime and compares with
  the original (both branches of every ``If``: mirserve's own check uses one random input), counts nodes at
  top level and inside subgraphs, and runs the peers once per model. Writes ``OUT/sweep.jsonl`` and a table.

Models: Silero-VAD-like (``If`` on ``sr`` with different 16k/8k sub-networks, LSTMCell state; static and
dynamic length), scripted loops (GRUCell greedy decoding over an int64 trip count with scan outputs; a while
loop with a data-dependent condition), nn.LSTM (2 layers, bidirectional) / nn.GRU / nn.RNN with initial states
and dynamic length, torchvision detection (builders from ``bench/detection_exports.py``), a YOLO-style
postprocess (TopK, NonMaxSuppression, ``If`` on an empty set), and scripted list code (SplitToSequence,
SequenceAt, ConcatFromSequence, Loop over a sequence).

Usage:
  /work/bench-env/venv/bin/python bench/control_flow_exports.py export [--out DIR] [--only NAME ...]
  .venv/bin/python bench/control_flow_exports.py sweep [--out DIR] [--only NAME ...] [--configs NAME ...]
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "out" / "control_flow"  # gitignored
PEERS_SCRIPT = REPO.parent / "shared" / "bench" / "peers.py"
PEERS_PYTHON = Path("/work/peers-env/bin/python")

# ---------------------------------------------------------------------------------------------------------
# Models (torch only inside the builders)
# ---------------------------------------------------------------------------------------------------------


def _vad_module(dynamo: bool = False):
    import torch
    from torch import nn

    class STFT(nn.Module):
        """An STFT as Silero does it: reflection pad, Conv1d with a fixed (cos, sin) basis, magnitude."""

        def __init__(self, n_fft: int, hop: int):
            super().__init__()
            self.n_fft, self.hop = n_fft, hop
            bins = n_fft // 2 + 1
            n = torch.arange(n_fft, dtype=torch.float32)
            k = torch.arange(bins, dtype=torch.float32)[:, None]
            window = torch.hann_window(n_fft, periodic=True)
            real = torch.cos(2 * math.pi * k * n / n_fft) * window
            imag = -torch.sin(2 * math.pi * k * n / n_fft) * window
            self.register_buffer("basis", torch.cat([real, imag], 0)[:, None, :])
            self.bins = bins

        def forward(self, x):
            x = nn.functional.pad(x.unsqueeze(1), [self.n_fft // 4, self.n_fft // 4], mode="reflect")
            spec = nn.functional.conv1d(x, self.basis, stride=self.hop)
            real, imag = spec[:, : self.bins], spec[:, self.bins:]
            return torch.sqrt(real * real + imag * imag)

    def encoder(c_in: int):
        return nn.Sequential(
            nn.Conv1d(c_in, 128, 3, padding=1), nn.ReLU(),
            nn.Conv1d(128, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(64, 128, 3, stride=1, padding=1), nn.ReLU())

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTMCell(128, 128)
            self.head = nn.Sequential(nn.Dropout(0.1), nn.ReLU(), nn.Conv1d(128, 1, 1), nn.Sigmoid())

        def forward(self, x, state):
            x = x.mean(-1)
            h, c = self.rnn(x, (state[0], state[1]))
            out = self.head(h.unsqueeze(-1))
            return out.squeeze(-1), torch.stack([h, c])

    class Branch(nn.Module):
        def __init__(self, n_fft: int, hop: int, context: int):
            super().__init__()
            self.context = context
            self.stft = STFT(n_fft, hop)
            self.encoder = encoder(n_fft // 2 + 1)
            self.decoder = Decoder()

        def forward(self, x, state):
            # Silero prepends context; here the last `context` samples reflected (no extra input).
            x = torch.cat([x[:, : self.context].flip(1), x], 1)
            feats = self.encoder(self.stft(x))
            return self.decoder(feats, state)

    class VAD(nn.Module):
        def __init__(self):
            super().__init__()
            self.b16 = Branch(256, 128, 64)
            self.b8 = Branch(128, 64, 32)

        def forward(self, input, state, sr):
            if sr == 16000:
                out, new_state = self.b16(input, state)
            else:
                out, new_state = self.b8(input, state)
            return out, new_state

    class VADCond(VAD):
        """The same branches chosen by torch.cond, which the dynamo exporter writes as an If."""

        def forward(self, input, state, sr):
            return torch.cond(sr == 16000, lambda x, s: self.b16(x, s), lambda x, s: self.b8(x, s), (input, state))

    torch.manual_seed(0)
    if dynamo:
        return VADCond().eval()
    vad = VAD().eval()
    # Script the top level (the If on sr) over traced branches, as Silero's JIT model does: scripting an
    # LSTMCell itself does not export (aten::__contains_ on a list).
    state = torch.zeros(2, 1, 128)
    vad.b16 = torch.jit.trace(vad.b16, (torch.randn(1, 512), state))
    vad.b8 = torch.jit.trace(vad.b8, (torch.randn(1, 256), state))
    return torch.jit.script(vad)


def _vad_inputs(n):
    import torch
    return (torch.randn(1, n) * 0.1, torch.zeros(2, 1, 128), torch.tensor(16000, dtype=torch.int64))


def _loop_greedy():
    import torch
    from torch import nn

    class Greedy(nn.Module):
        """GRUCell greedy decoding for `steps` steps: loop-carried hidden state and token, scan outputs."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 24)
            self.ih = nn.Linear(24, 3 * 48)
            self.hh = nn.Linear(48, 3 * 48)
            self.proj = nn.Linear(48, 32)

        def forward(self, h, token):
            # a GRUCell written out (aten::gru_cell's chunk does not export inside a Loop)
            gi, gh = self.ih(self.embed(token)), self.hh(h)
            r = torch.sigmoid(gi[:, :48] + gh[:, :48])
            z = torch.sigmoid(gi[:, 48:96] + gh[:, 48:96])
            n = torch.tanh(gi[:, 96:] + r * gh[:, 96:])
            h = (1 - z) * n + z * h
            logit = self.proj(torch.relu(h))
            return h, logit, logit.argmax(-1)

    class Loop(nn.Module):
        def __init__(self, step):
            super().__init__()
            self.step = step

        def forward(self, h, token, steps):
            tokens = []
            logits = []
            for _ in range(int(steps)):
                h, logit, token = self.step(h, token)
                tokens.append(token)
                logits.append(logit)
            return torch.stack(tokens, 1), torch.stack(logits, 1), h

    torch.manual_seed(0)
    step = torch.jit.trace(Greedy().eval(), (torch.zeros(1, 48), torch.tensor([3])))
    return torch.jit.script(Loop(step))


def _loop_while():
    import torch
    from torch import nn

    class Shrink(nn.Module):
        """A while loop whose condition depends on data: halve through a layer until the norm is small."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            i = 0
            while bool((x * x).sum() > 1.0) and i < 50:
                x = torch.tanh(self.lin(x)) * 0.5 + x * 0.25
                i += 1
            return x, torch.tensor(i)

    torch.manual_seed(0)
    return torch.jit.script(Shrink().eval())


def _rnn(kind: str):
    import torch
    from torch import nn

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "lstm":
                self.rnn = nn.LSTM(16, 32, num_layers=2, bidirectional=True, batch_first=True)
            elif kind == "gru":
                self.rnn = nn.GRU(16, 32, num_layers=2, batch_first=True)
            else:
                self.rnn = nn.RNN(16, 32, num_layers=1, batch_first=True, nonlinearity="tanh")
            self.head = nn.Linear(64 if kind == "lstm" else 32, 8)

        def forward(self, x, h0):
            y, h = self.rnn(x, h0)
            return self.head(y), h

    class WrapLSTM(Wrap):
        def forward(self, x, h0, c0):
            y, (h, c) = self.rnn(x, (h0, c0))
            return self.head(y), h, c

    torch.manual_seed(0)
    return (WrapLSTM() if kind == "lstm" else Wrap()).eval()


def _yolo_post():
    import torch
    import torchvision
    from torch import nn

    class Post(nn.Module):
        """A YOLO-style postprocess: confidence filter via TopK, NMS, an `If` on an empty detection set."""

        def forward(self, boxes, scores):
            # boxes [N, 4] (cx, cy, w, h), scores [N, C]
            conf, cls = scores.max(1)
            k = min(100, int(conf.shape[0]))
            top, idx = conf.topk(k)
            b = boxes[idx]
            xyxy = torch.cat([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], 1)
            keep_mask = top > 0.25
            xyxy, top, c = xyxy[keep_mask], top[keep_mask], cls[idx][keep_mask]
            if xyxy.shape[0] == 0:
                out = torch.zeros(1, 6)
            else:
                keep = torchvision.ops.nms(xyxy, top, 0.45)
                out = torch.cat([xyxy[keep], top[keep, None], c[keep, None].float()], 1)
            return out

    return torch.jit.script(Post())


def _seq_ops():
    import torch
    from torch import nn
    from typing import List

    class Seq(nn.Module):
        """Scripted list code: split with dynamic sizes, a list comprehension, indexing, concat."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x, chunk: int):
            parts = torch.split(x, int(chunk), dim=2)
            outs: List[torch.Tensor] = [torch.relu(self.bn(self.conv(p))) * 2.0 + 1.0 for p in parts]
            first = outs[0]
            last = outs[-1]
            return torch.cat(outs, 2), first.sum() + last.mean()

    torch.manual_seed(0)
    m = Seq().eval()
    m.bn.running_mean.uniform_(-0.1, 0.1)
    m.bn.running_var.uniform_(0.5, 1.5)
    return torch.jit.script(m)


def _if_nested():
    import torch
    from torch import nn

    class Nested(nn.Module):
        """Nested If on a flag and a data-dependent mean, branches with Conv+BN+ReLU and constant arithmetic."""

        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.b = nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.Sigmoid())
            self.c = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))

        def forward(self, x, mode: int):
            if mode == 0:
                y = self.a(x)
                if bool(y.mean() > 0.5):
                    y = y * 2.0 + 0.0
                else:
                    y = y.transpose(2, 3).transpose(2, 3) - 1.0
            elif mode == 1:
                y = self.b(x) * 1.0
            else:
                y = torch.relu(self.c(x)).reshape(x.shape[0], 8, -1).reshape(x.shape[0], 8, x.shape[2], x.shape[3])
            return y

    torch.manual_seed(0)
    m = Nested().eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    return torch.jit.script(m)


def _if_backbone():
    import torch
    from torch import nn

    def block(c_in, c_out, s=1):
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, s, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())

    class Backbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(block(3, 16, 2), block(16, 32, 2), block(32, 32), block(32, 32))

        def forward(self, x):
            return self.body(x)

    class Heads(nn.Module):
        """A traced backbone, then a head chosen by an int64 `task` (If), each head reading the features."""

        def __init__(self, backbone):
            super().__init__()
            self.backbone = backbone
            self.seg = nn.Sequential(block(32, 32), nn.Conv2d(32, 32, 1))
            self.cls = nn.Sequential(nn.Conv2d(32, 32, 1), nn.Sigmoid())

        def forward(self, x, task):
            feat = self.backbone(x)
            if task == 0:
                out = self.seg(feat) + feat
            else:
                out = self.cls(feat) * feat
            return out

    torch.manual_seed(0)
    bb = Backbone().eval()
    m = Heads(bb).eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    m.backbone = torch.jit.trace(bb, torch.rand(1, 3, 64, 64))
    return torch.jit.script(m)


def _detection(name):
    sys.path.insert(0, str(REPO / "bench"))
    from detection_exports import _torchvision_detection  # noqa: E402
    return _torchvision_detection(name)


def _export_all(out: Path, only):
    import torch

    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}

    def save(name, fn, kind, dynamic, ts=True, dynamo=None):
        """fn() -> (model, args, input_names, output_names, dynamic_axes)."""
        if only and name not in only:
            return
        for use_dynamo in ([False] if not ts else [False]) + ([True] if dynamo else []):
            fname = name + ("_dynamo" if use_dynamo else "")
            path = out / "models" / f"{fname}.onnx"
            path.parent.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            try:
                torch.manual_seed(0)
                model, args, inames, onames, axes = (dynamo if use_dynamo else fn)()
                with torch.no_grad():
                    if use_dynamo:
                        dshapes = None
                        if axes:
                            dims = {}
                            dshapes = []
                            for nm in inames:
                                ax = axes.get(nm)
                                dshapes.append({k: dims.setdefault(v, torch.export.Dim(v, min=2, max=4096))
                                                for k, v in ax.items()} if ax else None)
                            dshapes = tuple(dshapes)
                        prog = torch.onnx.export(model, args, dynamo=True, input_names=inames, output_names=onames,
                                                 dynamic_shapes=dshapes, opset_version=18)
                        prog.save(str(path))
                    else:
                        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17, input_names=inames,
                                          output_names=onames, dynamic_axes=axes or None,
                                          do_constant_folding=False)
                index[fname] = {"path": str(path), "kind": kind, "dynamic": dynamic, "exporter":
                                "dynamo" if use_dynamo else "torchscript"}
                print(f"{fname}: ok ({time.perf_counter() - started:.1f} s)", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"{fname}: EXPORT FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                      flush=True)
                (out / "export_errors").mkdir(exist_ok=True)
                (out / "export_errors" / f"{fname}.txt").write_text(traceback.format_exc())
            index_path.write_text(json.dumps(index, indent=1))

    vad_names, vad_out = ["input", "state", "sr"], ["output", "stateN"]

    def vad(n, dyn, dynamo=False):
        def f():
            m = _vad_module(dynamo)
            return m, _vad_inputs(n), vad_names, vad_out, ({"input": {1: "samples"}} if dyn else None)
        return f

    save("vad_static", vad(512, False), "vad", False, dynamo=vad(512, False, True))
    save("vad_dynamic", vad(512, True), "vad", True, dynamo=vad(512, True, True))

    def greedy():
        return (_loop_greedy(), (torch.zeros(1, 48), torch.tensor([3]), torch.tensor(5)), ["h", "token", "steps"],
                ["tokens", "logits", "h_out"], None)
    save("loop_greedy", greedy, "greedy", False)

    def shrink():
        return _loop_while(), (torch.randn(1, 16) * 3,), ["x"], ["y", "trips"], None
    save("loop_while", shrink, "while", False)

    for kind in ("lstm", "gru", "rnn"):
        def rnn(kind=kind):
            layers = 2 if kind != "rnn" else 1
            dirs = 2 if kind == "lstm" else 1
            x = torch.randn(2, 7, 16)
            h0 = torch.zeros(layers * dirs, 2, 32)
            args = (x, h0) + ((torch.zeros(layers * dirs, 2, 32),) if kind == "lstm" else ())
            names = ["x", "h0"] + (["c0"] if kind == "lstm" else [])
            onames = ["y", "h"] + (["c"] if kind == "lstm" else [])
            axes = {"x": {0: "batch", 1: "seq"}, **{n: {1: "batch"} for n in names[1:]}}
            return _rnn(kind), args, names, onames, axes
        save(f"{kind}", rnn, kind, True, dynamo=rnn)

    def yolo_post():
        return (_yolo_post(), (torch.rand(300, 4) * 100, torch.rand(300, 5)), ["boxes", "scores"], ["dets"],
                {"boxes": {0: "n"}, "scores": {0: "n"}})
    save("yolo_post", yolo_post, "yolo_post", True)

    def seq():
        return _seq_ops(), (torch.randn(1, 4, 20), torch.tensor(6)), ["x", "chunk"], ["y", "s"], {"x": {2: "len"}}
    save("seq_ops", seq, "seq", True)

    def nested():
        return _if_nested(), (torch.randn(1, 3, 16, 16), torch.tensor(0)), ["x", "mode"], ["y"], None
    save("if_nested", nested, "nested", False)

    def backbone():
        return _if_backbone(), (torch.rand(1, 3, 64, 64), torch.tensor(0)), ["x", "task"], ["y"], None
    save("if_backbone", backbone, "backbone", False)

    for det in ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn", "retinanet_resnet50_fpn",
                "maskrcnn_resnet50_fpn"):
        def d(det=det):
            return _detection(det), ([torch.rand(3, 320, 320)],), ["images"], None, None
        save(det, d, "detection", False)


# ---------------------------------------------------------------------------------------------------------
# Feeds (numpy only)
# ---------------------------------------------------------------------------------------------------------


def _audio(rng, n, f0):
    t = np.arange(n) / 16000.0
    return (0.3 * np.sin(2 * np.pi * f0 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)[None]


def feeds(kind: str, inputs: dict, fixed: bool):
    """Three real-looking feeds. `inputs`: name -> (elem numpy dtype, dims list with None for symbolic).
    `fixed`: the feeds must keep the first feed's shapes (for --input-shape runs)."""
    rng = np.random.default_rng(1)
    out = []
    if kind == "vad":
        static_n = inputs["input"][1][1]
        plan = [(16000, 512, 220.0), (8000, 256, 440.0), (16000, 512, 0.0)]
        if static_n is not None or fixed:
            plan = [(16000, 512, 220.0), (8000, 512, 440.0), (8000, 512, 0.0)]
        for k, (sr, n, f0) in enumerate(plan):
            state = (rng.standard_normal((2, 1, 128)) * (0.5 * k)).astype(np.float32)
            out.append({"input": _audio(rng, n, f0), "state": state, "sr": np.array(sr, dtype=np.int64)})
    elif kind == "greedy":
        for steps, tok in ((5, 3), (1, 7), (12, 0)):
            out.append({"h": rng.standard_normal((1, 48)).astype(np.float32), "token": np.array([tok], np.int64),
                        "steps": np.array(steps, np.int64)})
    elif kind == "while":
        for scale in (3.0, 0.1, 30.0):
            out.append({"x": (rng.standard_normal((1, 16)) * scale).astype(np.float32)})
    elif kind in ("lstm", "gru", "rnn"):
        layers = inputs["h0"][1][0]
        for b, t in ((2, 7), (1, 3), (3, 11)) if not fixed else ((2, 7), (2, 7), (2, 7)):
            f = {"x": rng.standard_normal((b, t, 16)).astype(np.float32),
                 "h0": (rng.standard_normal((layers, b, 32)) * 0.5).astype(np.float32)}
            if "c0" in inputs:
                f["c0"] = (rng.standard_normal((layers, b, 32)) * 0.5).astype(np.float32)
            out.append(f)
    elif kind == "yolo_post":
        for n, hi in ((300, 1.0), (50, 0.2), (300, 1.0)) if not fixed else ((300, 1.0), (300, 0.2), (300, 0.6)):
            centers = rng.uniform(20, 300, (n, 2))
            sizes = rng.uniform(5, 60, (n, 2))
            out.append({"boxes": np.concatenate([centers, sizes], 1).astype(np.float32),
                        "scores": rng.uniform(0, hi, (n, 5)).astype(np.float32)})
    elif kind == "seq":
        for length, chunk in ((20, 6), (9, 9), (33, 4)) if not fixed else ((20, 6), (20, 3), (20, 20)):
            out.append({"x": rng.standard_normal((1, 4, length)).astype(np.float32),
                        "chunk": np.array(chunk, np.int64)})
    elif kind == "nested":
        for mode, shift in ((0, 0.0), (0, 3.0), (1, 0.0), (2, 0.0)):
            out.append({"x": (rng.standard_normal((1, 3, 16, 16)) + shift).astype(np.float32),
                        "mode": np.array(mode, np.int64)})
    elif kind == "backbone":
        for task in (0, 1, 0):
            out.append({"x": rng.uniform(0, 1, (1, 3, 64, 64)).astype(np.float32), "task": np.array(task, np.int64)})
    elif kind == "detection":
        for k in range(3):
            img = rng.uniform(0, 1, (3, 320, 320)).astype(np.float32)
            if k == 1:
                img[:, 80:240, 80:240] = 0.9
            out.append({"images": img})
    else:
        raise ValueError(kind)
    return out


def shape_arg(feed: dict, dynamic_names) -> list:
    return [f"{n}={','.join(str(d) for d in feed[n].shape)}" for n in dynamic_names]


# ---------------------------------------------------------------------------------------------------------
# Sweep
# ---------------------------------------------------------------------------------------------------------

CONFIGS = {
    "default": [],
    "arm_fp16_nhwc": ["--places", "arm/fp16/nhwc,arm/fp32/nchw"],
    "opencl_fp16": ["--places", "opencl/fp16/nchw,arm/fp32/nchw"],
    "npu_int8": ["--places", "npu/int8/nchw,arm/fp32/nchw"],
    "portable": ["--portable"],
}


def count_nodes(graph, depth=0, acc=None):
    acc = acc if acc is not None else {"top": 0, "sub": 0, "sub_ops": {}, "top_ops": {}}
    for node in graph.node:
        if depth == 0:
            acc["top"] += 1
            acc["top_ops"][node.op_type] = acc["top_ops"].get(node.op_type, 0) + 1
        else:
            acc["sub"] += 1
            acc["sub_ops"][node.op_type] = acc["sub_ops"].get(node.op_type, 0) + 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                count_nodes(attr.g, depth + 1, acc)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    count_nodes(g, depth + 1, acc)
    return acc


def model_inputs(model):
    init = {i.name for i in model.graph.initializer}
    res = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        res[vi.name] = (onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type), dims)
    return res


def run_ort(path, feed_list, names):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    accepted = {i.name for i in sess.get_inputs()}
    results = []
    for feed in feed_list:
        try:
            results.append(sess.run(None, {k: v for k, v in feed.items() if k in accepted}))
        except Exception as exc:  # noqa: BLE001
            results.append(exc)
    return results


def compare(ref, got, fp16):
    rows = []
    for r, g in zip(ref, got):
        if isinstance(r, Exception):
            rows.append({"ref_error": str(r)[:200]})
            continue
        if isinstance(g, Exception):
            rows.append({"error": str(g).splitlines()[0][:300], "ok": False})
            continue
        worst, ok, shapes_ok = 0.0, True, True
        for a, b in zip(r, g):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                shapes_ok, ok = False, False
                continue
            if a.size == 0:
                continue
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst = max(worst, float(diff.max()))
            tol_r, tol_a = (5e-2, 5e-2) if fp16 else (1e-3, 1e-4)
            if not np.all(diff <= tol_a + tol_r * np.abs(a.astype(np.float64))):
                ok = False
        rows.append({"max_abs_diff": worst, "ok": ok, "shapes_ok": shapes_ok,
                     "shapes": [list(np.asarray(x).shape) for x in g]})
    return rows


def _sweep(out: Path, only, configs, timeout, no_peers, peers_python: Path = PEERS_PYTHON):
    index = json.loads((out / "index.json").read_text())
    results_path = out / "sweep.jsonl"
    done = set()
    if results_path.exists():
        for line in results_path.read_text().splitlines():
            row = json.loads(line)
            done.add((row["model"], row["config"], row["shape"]))
    mirserve = str(REPO / ".venv" / "bin" / "mirserve")
    for name, meta in index.items():
        if only and name not in only and not any(name.startswith(o) for o in only):
            continue
        path = Path(meta["path"])
        model = onnx.load(str(path))
        inputs = model_inputs(model)
        before = count_nodes(model.graph)
        dyn_names = [n for n, (_, dims) in inputs.items() if any(d is None for d in dims)]
        variants = [("open", False)] + ([("fixed", True)] if dyn_names else [])
        if not no_peers and (name, "peers", "-") not in done:
            shape = shape_arg(feeds(meta["kind"], inputs, True)[0], dyn_names)
            cmd = [str(peers_python), str(PEERS_SCRIPT), str(path), "--timeout", str(timeout)]
            for s in shape:
                cmd += ["--shape", s]
            started = time.perf_counter()
            try:
                child = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * 6)
                last = (child.stdout.strip().splitlines() or ["{}"])[-1]
                peers = json.loads(last) if last.startswith("{") else {"error": child.stderr[-500:]}
            except subprocess.TimeoutExpired:
                peers = {"error": "timeout"}
            with results_path.open("a") as fh:
                fh.write(json.dumps({"model": name, "config": "peers", "shape": "-", "peers": peers,
                                     "seconds": round(time.perf_counter() - started, 1)}) + "\n")
        for variant, fixed in variants:
            feed_list = feeds(meta["kind"], inputs, fixed)
            ref = run_ort(path, feed_list, None)
            shape = shape_arg(feed_list[0], dyn_names) if fixed else []
            for config in configs:
                key = (name, config, variant)
                if key in done:
                    continue
                opt = out / "opt" / f"{name}.{config}.{variant}.onnx"
                report = out / "opt" / f"{name}.{config}.{variant}.report.json"
                opt.parent.mkdir(parents=True, exist_ok=True)
                cmd = [mirserve, "optimize", str(path), "-o", str(opt), "--json", "--report", str(report)]
                cmd += CONFIGS[config]
                for s in shape:
                    cmd += ["--input-shape", s]
                row = {"model": name, "config": config, "shape": variant, "cmd": " ".join(cmd),
                       "before": {k: before[k] for k in ("top", "sub")}}
                started = time.perf_counter()
                try:
                    child = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(out))
                    row["exit"] = child.returncode
                    row["stderr"] = child.stderr[-2000:]
                    try:
                        row["summary"] = json.loads(child.stdout)
                    except Exception:  # noqa: BLE001
                        row["stdout"] = child.stdout[-1000:]
                except subprocess.TimeoutExpired:
                    row["exit"] = "timeout"
                row["seconds"] = round(time.perf_counter() - started, 1)
                if report.exists() and row["exit"] == 0:
                    try:
                        rep = json.loads(report.read_text())
                        ver = rep.get("verification") or {}
                        row["verified"] = ver.get("passed")
                        row["verify_max_abs"] = max((o.get("max_abs_diff") or 0.0 for o in ver.get("outputs", [])),
                                                    default=None)
                        row["warnings"] = rep.get("warnings") or (rep.get("summary") or {}).get("warnings")
                    except Exception as exc:  # noqa: BLE001
                        row["report_error"] = str(exc)
                if row["exit"] == 0 and opt.exists():
                    optm = onnx.load(str(opt))
                    after = count_nodes(optm.graph)
                    row["after"] = {k: after[k] for k in ("top", "sub")}
                    row["after_sub_ops"] = after["sub_ops"]
                    row["before_sub_ops"] = before["sub_ops"]
                    got = run_ort(opt, feed_list, None)
                    row["check"] = compare(ref, got, "fp16" in config)
                    row["check_ok"] = all(c.get("ok", True) for c in row["check"])
                with results_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                brief = row.get("check_ok")
                err = "" if row["exit"] == 0 else (row.get("stderr") or "").strip().splitlines()[-1:] 
                print(f"{name} {config} {variant}: exit {row['exit']} {row['seconds']}s verified={row.get('verified')}"
                      f" nodes {row['before']}->{row.get('after')} own-check={brief} {err}", flush=True)


def table(out: Path):
    rows = [json.loads(l) for l in (out / "sweep.jsonl").read_text().splitlines()]
    peers = {r["model"]: r["peers"] for r in rows if r["config"] == "peers"}
    lines = ["| model | config | shape | exit | s | mirserve verified (max diff) | nodes top+sub before -> after | "
             "our 3-input check (max diff) | onnxsim / onnxslim |", "|" + "---|" * 9]
    for r in rows:
        if r["config"] == "peers":
            continue
        p = peers.get(r["model"], {})
        pr = {x.get("peer"): x for x in p.get("rows", [])} if isinstance(p, dict) else {}

        def pn(k):
            x = pr.get(k) or {}
            return str(x.get("nodes", "err" if x else "-"))
        b, a = r["before"], r.get("after")
        nodes = f"{b['top']}+{b['sub']} -> " + (f"{a['top']}+{a['sub']}" if a else "-")
        chk = r.get("check") or []
        chk_s = "-" if not chk else ("OK" if r.get("check_ok") else "FAIL") + " (" + ", ".join(
            (f"{c['max_abs_diff']:.2g}" if "max_abs_diff" in c else ("ERR" if "error" in c else "ref-err"))
            + ("" if c.get("ok", True) else "!") for c in chk) + ")"
        exit_s = str(r["exit"])
        if r["exit"] not in (0,):
            exit_s += ": " + ((r.get("stderr") or "").strip().splitlines() or ["?"])[-1][:120].replace("|", "/")
        vm = r.get("verify_max_abs")
        lines.append(f"| {r['model']} | {r['config']} | {r['shape']} | {exit_s} | {r['seconds']} | "
                     f"{r.get('verified')} ({'-' if vm is None else f'{vm:.2g}'}) | {nodes} | {chk_s} | "
                     f"{pn('onnxsim')} / {pn('onnxslim')} |")
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    print(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, default=DEFAULT_OUT)
    e.add_argument("--only", action="append")
    s = sub.add_parser("sweep")
    s.add_argument("--out", type=Path, default=DEFAULT_OUT)
    s.add_argument("--only", action="append")
    s.add_argument("--configs", nargs="*", default=list(CONFIGS))
    s.add_argument("--timeout", type=int, default=300)
    s.add_argument("--no-peers", action="store_true")
    s.add_argument("--peers-python", type=Path, default=PEERS_PYTHON, help="a Python with onnxsim and onnxslim")
    t = sub.add_parser("table")
    t.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.cmd == "export":
        _export_all(args.out, args.only)
    elif args.cmd == "sweep":
        _sweep(args.out, args.only, args.configs, args.timeout, args.no_peers, args.peers_python)
    else:
        table(args.out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("sweep", "table"):
        import numpy as np  # noqa: E402
        import onnx  # noqa: E402
    else:
        import numpy as np  # noqa: E402,F811
    sys.exit(main())
