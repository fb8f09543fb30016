"""Running one rewrite pass on a small onnx.helper model: IR verified after every pass, outputs compared on
onnxruntime against the model before, and the trace kept for asserting rewrites and refusal sentences."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx

from tests.conftest import random_feeds, run_onnxruntime
from worker.engine.ir import Model, load_model, save_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.places import parse_places

RTOL, ATOL = 1e-4, 1e-5


@dataclass
class Outcome:
    model: Model
    path: Path
    trace: list[dict]
    ops: list[str] = field(default_factory=list)

    def entry(self, name: str) -> dict:
        return next(e for e in self.trace if e["pass"] == name)

    def rewrites(self, name: str) -> int:
        return sum(e["rewrites"] for e in self.trace if e["pass"] == name)

    def refusals(self, name: str | None = None) -> list[str]:
        return [reason for e in self.trace if name in (None, e["pass"]) for reason in e.get("refusals", {})]

    def refused(self, fragment: str) -> bool:
        return any(fragment in reason for reason in self.refusals())

    def node(self, op_type: str):
        found = self.model.graph.nodes_of_type(op_type)
        assert len(found) == 1, f"expected one {op_type}, found {len(found)}"
        return found[0]


def optimize(tmp_path: Path, proto: onnx.ModelProto, passes: Sequence[str], *, shapes: dict | None = None,
             seed: int = 0, check: bool = True, fixed: dict | None = None, valid: bool = True,
             **options) -> Outcome:
    """Run type inference then ``passes`` on ``proto``; unless ``check`` is off, compare the outputs on
    random inputs (``fixed`` overrides some of them). ``valid=False`` is for inputs onnx rejects."""
    before = tmp_path / "before.onnx"
    onnx.save(proto, str(before))
    model = load_model(before, target_opset=options.get("target_opset"))
    apply_input_shapes(model.graph, shapes or {})
    opts = OptimizeOptions(input_shapes=shapes or {}, **options)
    ctx = PassContext(model, opts, parse_places(opts.places, host_fallback=opts.host_fallback))
    trace = PassManager(instruments=[VerifyInstrument()]).run(ctx, ["type_inference", *passes])
    if valid:
        assert_typed(model)
    after = tmp_path / "after.onnx"
    save_model(model, after)
    if valid:
        onnx.checker.check_model(onnx.load(str(after)), full_check=True)
    if check:
        assert_same_outputs(before, after, shapes, seed, fixed)
    return Outcome(model, after, trace, [n.op_type for n in model.graph])


def assert_typed(model: Model) -> None:
    """Every value a node produces carries a dtype and a shape (type inference runs only once, first)."""
    for graph in model.graph.all_graphs():
        for node in graph:
            for value in node.outputs:
                if value.is_used:
                    assert value.dtype and value.shape is not None, f"{value!r} made by {node!r} is untyped"


def assert_same_outputs(before: Path, after: Path, shapes: dict | None = None, seed: int = 0,
                        fixed: dict | None = None) -> None:
    feeds = {name: np.asarray(x) for name, x in random_feeds(before, shapes, seed=seed).items()}
    for name, x in feeds.items():  # signed inputs exercise negative slopes, clips and pads
        if np.issubdtype(x.dtype, np.floating):
            feeds[name] = (x * 8 - 4).astype(x.dtype)
    feeds.update(fixed or {})
    expected, actual = run_onnxruntime(before, feeds), run_onnxruntime(after, feeds)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def floats(*shape, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return rng(seed).uniform(low, high, shape).astype(np.float32)
