"""Auto mixed precision against a re-run-per-step bisection in graph order (onnxconverter-common's way).

For each model that fails verification in fp16 under ``--places`` (default arm/fp16/nhwc,arm/fp32/nchw), both
searches look for nodes to keep in fp32; each step rebuilds the model with those pinned and verifies it (one
onnxruntime run of each model), so steps are what costs. Ours: one traced run of both models ranks the fp16
nodes by error growth, a bisection over that order, then each pinned node tried without its pin. The baseline
knows nothing of where the error comes from: it tries segments of the nodes in graph order in fp16 with the
rest in fp32, accepts a segment that verifies and splits one that does not, down to single nodes.

Models: softmax over large logits, a LayerNorm with a large variance, fp16 rounding spread over a chain of
MatMuls, a chain of QDQ Convs whose int8 kernels round apart from the float reference (under
``npu/int8/nchw,arm/fp32/nchw``; all four also in tests/engine/test_amp.py),
a small BERT encoder from bench/bert_base_graph.py (weights are graph inputs: verification draws them), and
two models of onnx's light model zoo whose constant weights make fp16 overflow nearly everywhere (Inception
v1, SqueezeNet).

A step builds as the engine's search does (``--steps pinned``): the passes before kernel pick once
(``worker.engine.pinned_builds``), the reference's outputs recorded at the first verification and read after,
the candidate written with its fp16 values stored in fp16 (``numeric.save_stored_in_fp16``), which the
verification child loads as it is. ``--steps rewritten`` writes the candidate as it is and lets the child store
its fp16 values (parse, shape inference, serialize: as steps did before), ``--steps whole`` builds and verifies
the way the engine did before that (every pass and the reference again at every step), for comparison.
``--file`` adds a model from disk (e.g. a bench/vision_exports.py export; ``--no-baseline`` for large ones).

Usage: python bench/amp.py [--places P] [--only NAME] [--file MODEL.onnx] [--steps pinned|rewritten|whole]
                          [--no-baseline]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PLACES = "arm/fp16/nhwc,arm/fp32/nchw"


def _model(nodes, inputs, outputs, initializers, opset=13):
    graph = helper.make_graph(nodes, "amp", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _t(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def softmax_over_large_logits(seed: int = 3) -> onnx.ModelProto:
    """Logits near 30000, where fp16's step is 16: in fp16 every logit rounds to the same value. The MatMuls
    around are large enough that the plan puts the whole chain in fp16; the Relu first is harmless there."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["mm"], name="matmul"),
             helper.make_node("Add", ["mm", "b"], ["logits"], name="bias"),
             helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "w2"], ["y"], name="project")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])],
                  [_t("w", rng.standard_normal((256, 256)) * 0.05), _t("b", np.full(256, 30000.0)),
                   _t("w2", rng.standard_normal((256, 256)))])


def layernorm_with_large_variance(seed: int = 3) -> onnx.ModelProto:
    """A LayerNorm written out (opset 13) between two MatMuls, over values of ~1e3: their squares overflow
    fp16 (65504)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="embed"),
             helper.make_node("Mul", ["h", "scale"], ["xs"], name="scale_up"),
             helper.make_node("ReduceMean", ["xs"], ["mean"], axes=[-1], name="mean"),
             helper.make_node("Sub", ["xs", "mean"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
             helper.make_node("Div", ["d", "std"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "gamma"], ["ng"], name="mul_gamma"),
             helper.make_node("Add", ["ng", "beta"], ["z"], name="add_beta"),
             helper.make_node("MatMul", ["z", "w1"], ["y"], name="project")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])],
                  [_t("w0", rng.standard_normal((256, 256)) * 0.1), _t("scale", 3000.0), _t("two", 2.0),
                   _t("eps", 1e-5), _t("gamma", rng.standard_normal(256)), _t("beta", rng.standard_normal(256)),
                   _t("w1", rng.standard_normal((256, 256)) * 0.1)])


def rounding_spread(layers: int = 24, scale: float = 2.0, seed: int = 5) -> onnx.ModelProto:
    """fp16's error by rounding, not range: a chain of MatMuls by random orthogonal 64x64 matrices (values stay
    near 1, far from fp16's limits), the result scaled by ``scale``. Each MatMul's output rounded to fp16 adds
    about the same error, and no one of them is the culprit: the output verifies only with nearly all of them
    in fp32 (torchvision's DeepLabV3 in small)."""
    rng = np.random.default_rng(seed)
    nodes, weights, value = [], [], "x"
    for i in range(layers):
        orthogonal, _ = np.linalg.qr(rng.standard_normal((64, 64)))
        weights.append(_t(f"w{i}", orthogonal))
        nodes.append(helper.make_node("MatMul", [value, f"w{i}"], [f"h{i}"], name=f"matmul{i}"))
        value = f"h{i}"
    nodes.append(helper.make_node("Mul", [value, "scale"], ["y"], name="scale_up"))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [*weights, _t("scale", scale)])


def quantized_conv_chain(layers: int = 4, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A QDQ model (opset 13): ``layers`` 3x3 Convs on int8 weights, each between DequantizeLinear and
    QuantizeLinear, float biases. Under ``npu/int8/nchw,arm/fp32/nchw`` each Conv runs on the npu's QLinearConv,
    which rounds its accumulator once where the input computes in float and rounds at its QuantizeLinear:
    values on a rounding tie come out a step apart, and the Convs after grow that past the tolerance (an
    uncalibrated torchvision ResNet-18 in small)."""
    rng = np.random.default_rng(seed)
    nodes, weights = [], []

    def quantized(name: str, value: str, scale: float) -> str:
        weights.extend([_t(f"{name}_scale", scale), numpy_helper.from_array(np.array(0, np.int8), f"{name}_zero")])
        nodes.append(helper.make_node("QuantizeLinear", [value, f"{name}_scale", f"{name}_zero"], [f"{name}_q"],
                                      name=f"{name}_quantize"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero"],
                                      [f"{name}_dq"], name=f"{name}_dequantize"))
        return f"{name}_dq"

    value = quantized("x", "x", 0.05)
    for i in range(layers):
        weights += [numpy_helper.from_array(rng.integers(-127, 128, (channels, channels, 3, 3)).astype(np.int8),
                                            f"w{i}_int8"), _t(f"w{i}_scale", 0.01),
                    numpy_helper.from_array(np.array(0, np.int8), f"w{i}_zero"),
                    _t(f"b{i}", rng.normal(0, 0.1, channels))]
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}_int8", f"w{i}_scale", f"w{i}_zero"], [f"w{i}"],
                                      name=f"w{i}_dequantize"))
        nodes.append(helper.make_node("Conv", [value, f"w{i}", f"b{i}"], [f"conv{i}_out"], name=f"conv{i}",
                                      pads=[1, 1, 1, 1]))
        value = quantized(f"conv{i}", f"conv{i}_out", 0.05 * (i + 2))
    nodes.append(helper.make_node("Identity", [value], ["y"], name="output"))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 16, 16])], weights)


def bert_small() -> onnx.ModelProto:
    from bench.bert_base_graph import bert_base_model

    return bert_base_model(layers=2, hidden=64, heads=4, ffn=256, seq=16, vocab=100)


def light(name: str):
    """A model of onnx's light model zoo (its weights made by ConstantOfShape: constants, which overflow fp16
    a few layers in)."""
    def load() -> onnx.ModelProto:
        return onnx.load(str(Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"))
    return load


MODELS = {"softmax": softmax_over_large_logits, "layernorm": layernorm_with_large_variance,
          "quantized": quantized_conv_chain,
          "rounding": rounding_spread, "bert_small": bert_small,
          "inception_v1": light("light_inception_v1"), "squeezenet": light("light_squeezenet")}
#: Models measured under places of their own unless --places is given: int8 kernels, not fp16 ones.
MODEL_PLACES = {"quantized": "npu/int8/nchw,arm/fp32/nchw"}


class Runner:
    """Builds the model with nodes pinned to fp32 and verifies it, counting the steps."""

    def __init__(self, source: Path, places: str, scratch: Path, whole: bool = False, rewritten: bool = False):
        from worker.engine.api import tolerances
        from worker.engine.kernels import default_table
        from worker.engine.limits import Limits
        from worker.engine.options import OptimizeOptions
        from worker.engine.passes import get_pipeline
        from worker.engine.pinned_builds import PinnedBuilds
        from worker.engine.places import parse_places

        self.source, self.scratch, self.whole, self.rewritten = source, scratch, whole, rewritten
        self.options = OptimizeOptions(places=places, limits=Limits(max_output_mb=1024))  # the light zoo's folds
        self.places = parse_places(places)
        self.steps = get_pipeline("default").steps_for(self.options)
        self.kernels = default_table()
        self.rtol, self.atol = tolerances(self.options, self.places)
        self.runs = 0
        self.builds = PinnedBuilds(self.load, self.steps)

    def load(self, pinned=()):
        from worker.engine.ir import load_model
        from worker.engine.passes import PassContext

        return PassContext(load_model(self.source, limits=self.options.limits), self.options, self.places,
                           kernels=self.kernels, pinned_fp32=frozenset(pinned))

    def build(self, pinned=()):
        from worker.engine.passes import PassManager

        if not self.whole:
            return self.builds(pinned)[0]
        ctx = self.load(pinned)
        PassManager().run(ctx, self.steps)
        return ctx.model

    def unchanged(self, pins, fewer) -> bool:
        """The model built with ``fewer`` pins is the one built with ``pins`` (every node's kernel and place)."""
        from worker.engine.api import _placement_of

        key = frozenset(pins)
        if getattr(self, "_placed", (None,))[0] != key:
            self._placed = key, _placement_of(self.build(pins))  # the search asks about one set many times
        return self._placed[1] == _placement_of(self.build(fewer))

    def saved(self, model) -> tuple[Path, bool]:
        """The candidate written (as the engine's steps write it, its fp16 values stored in fp16 already, unless
        ``--steps whole`` or ``rewritten``: the child stores them) and whether it was written so."""
        from worker.engine.ir import save_model
        from worker.engine.numeric import save_stored_in_fp16

        path = self.scratch / "candidate.onnx"
        if self.whole or self.rewritten:
            save_model(model, path)
            return path, False
        return path, save_stored_in_fp16(model, path)

    def trial(self, pinned) -> tuple[bool, str]:
        from worker.engine.errors import VerificationError
        from worker.engine.numeric import verify

        self.runs += 1
        expected = None if self.whole else str(self.scratch / "reference.npz")
        candidate, stored = self.saved(self.build(pinned))
        try:
            verify(str(self.source), str(candidate), rtol=self.rtol, atol=self.atol, expected=expected,
                   candidate_stored=stored)
            return True, "verified"
        except VerificationError as exc:
            return False, str(exc)


def segment_search(names: list[str], trial) -> set[str]:
    """The baseline: segments of the nodes in graph order tried in fp16 (the rest in fp32); a segment that
    verifies stays fp16, one that does not is split, down to single nodes, which stay in fp32."""
    everything, fp16, kept = set(names), set(), set()

    def visit(segment: list[str]) -> None:
        passed, _ = trial(everything - fp16 - set(segment))
        if passed:
            fp16.update(segment)
        elif len(segment) == 1:
            kept.update(segment)
        else:
            middle = len(segment) // 2
            visit(segment[:middle])
            visit(segment[middle:])

    visit(list(names))
    return kept


def measure(name: str, model: onnx.ModelProto, places: str, whole: bool = False, baseline: bool = True,
            rewritten: bool = False) -> dict:
    from worker.engine import amp
    from worker.engine.limits import Limits
    from worker.engine.numeric import value_errors

    with tempfile.TemporaryDirectory(prefix="mirserve-amp-") as scratch:
        scratch = Path(scratch)
        source = scratch / f"{name}.onnx"
        onnx.save(model, source)
        runner = Runner(source, places, scratch, whole, rewritten)
        first = runner.build()
        passed, found = runner.trial(())
        if passed:
            return {"model": name, "note": "verifies in fp16: nothing to do"}
        fp16_names = [amp.picked_name(n) for n in amp.reduced_nodes(first.graph)]
        first_path = scratch / "first.onnx"
        from worker.engine.ir import save_model

        save_model(first, first_path)
        started = time.perf_counter()
        errors, beyond = value_errors(str(source), str(first_path), shapes=_shapes(model), rtol=runner.rtol,
                                      atol=runner.atol, with_range=True, memory_mb=Limits().verify_memory_mb)
        order = amp.rank(first.graph, errors, beyond)
        runner.runs = 0
        outcome = amp.search(order, lambda pins: runner.trial(pins), unchanged=runner.unchanged)
        ours = {"steps": runner.runs + 1, "seconds": time.perf_counter() - started,
                "pinned": [r.node for r in outcome.pinned] if outcome.passed else None,
                "stopped": outcome.stopped}
        if not baseline:
            return {"model": name, "fp16_nodes": len(fp16_names), "ours": ours, "baseline": None,
                    "failure": found[:160]}
        started = time.perf_counter()
        runner.runs = 0
        kept = segment_search(fp16_names, runner.trial)
        final, _ = runner.trial(kept)
        baseline = {"steps": runner.runs, "seconds": time.perf_counter() - started,
                    "pinned": sorted(kept) if final else None}
        return {"model": name, "fp16_nodes": len(fp16_names), "ours": ours, "baseline": baseline,
                "failure": found[:160]}


def _shapes(model: onnx.ModelProto) -> dict:
    initializers = {t.name for t in model.graph.initializer}
    return {v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim] for v in model.graph.input
            if v.name not in initializers}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--places", help=f"the places of every model (default: {PLACES}, the quantized model's "
                                         f"{MODEL_PLACES['quantized']})")
    parser.add_argument("--only", action="append", choices=list(MODELS))
    parser.add_argument("--steps", choices=("pinned", "rewritten", "whole"), default="pinned",
                        help="pinned: steps as the engine takes them; rewritten: the same, but each candidate written "
                             "as it is and stored in fp16 by the verification child; whole: every pass and the "
                             "reference again")
    parser.add_argument("--file", type=Path, action="append", default=[],
                        help="an ONNX model to measure as well (repeatable; named by its file name)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="ours only (the baseline bisects down to single nodes: ~2 steps a node where most "
                             "must stay in fp32, as in the light zoo's models)")
    args = parser.parse_args(argv)
    print(f"places {args.places or PLACES} (unless the row says); a step = rebuild with pins + verify "
          f"({args.steps}); ours counts its one traced "
          f"run as a step")
    print(f"{'model':<12} {'fp16/int8':>10}  {'ours: steps':>11} {'s':>6} {'pinned':>6}  "
          f"{'graph-order bisection: steps':>28} {'s':>6} {'pinned':>6}")
    models = {name: MODELS[name] for name in args.only or ([] if args.file else list(MODELS))}
    models.update({path.name.removesuffix(".onnx"): (lambda path=path: onnx.load(str(path))) for path in args.file})
    for name, build in models.items():
        places = args.places or MODEL_PLACES.get(name, PLACES)
        if places != (args.places or PLACES):
            print(f"{name:<12} under {places}")
        row = measure(name, build(), places, args.steps == "whole", not args.no_baseline,
                      args.steps == "rewritten")
        if "note" in row:
            print(f"{name:<12} {row['note']}")
            continue
        ours, base = row["ours"], row["baseline"] or {"steps": "-", "seconds": float("nan"), "pinned": ()}
        count = lambda p: "fail" if p is None else str(len(p))  # noqa: E731
        print(f"{name:<12} {row['fp16_nodes']:>10}  {ours['steps']:>11} {ours['seconds']:>6.1f} "
              f"{count(ours['pinned']):>6}  {base['steps']:>28} {base['seconds']:>6.1f} {count(base['pinned']):>6}",
              flush=True)
        if ours["stopped"]:
            print(f"{'':<12} unpinning stopped: {ours['stopped']}")
        if len(ours["pinned"] or ()) <= 12:
            print(f"{'':<12} ours pinned {ours['pinned']}; baseline pinned {base['pinned'] or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
