"""Running the domain fusions on one-rule models and checking what they wrote on both runtimes."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx

from tests.conftest import run_onnxruntime
from worker.engine.ir import load_model, save_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.places import parse_places


class Kernels:
    """A kernel lookup holding exactly the given (op, domain, target) entries."""

    def __init__(self, *entries: tuple[str, str, str]):
        self.entries = set(entries)

    def has_kernel(self, op_type, domain, targets) -> bool:
        return any((op_type, domain, t) in self.entries for t in targets)

    def kernels(self, op_type, domain="", *, opset=None, targets=None) -> list:
        """No kernel entries to rank: the placement check has nothing to compare and lets a fusion through."""
        return []


def run_passes(proto: onnx.ModelProto, tmp_path: Path, passes: Sequence[str], *, kernels=None,
               places: str = "x86/fp32/nchw", **options) -> tuple[Path, list[dict]]:
    """Save ``proto``, run type inference and ``passes`` with the IR verified after each, write the result."""
    source = tmp_path / "in.onnx"
    onnx.save(proto, str(source))
    model = load_model(source)
    opts = OptimizeOptions(places=places, **options)
    ctx = PassContext(model, opts, parse_places(opts.places), kernels=kernels)
    trace = PassManager(instruments=[VerifyInstrument()]).run(ctx, ("type_inference", *passes))
    output = tmp_path / "out.onnx"
    save_model(model, output)
    return output, trace


def op_counts(path: Path) -> Counter:
    model = onnx.load(str(path))
    return Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def refusals(trace: list[dict]) -> list[str]:
    return [reason for entry in trace for reason in entry.get("refusals", {})]


def run_reference(path: Path, feeds: dict) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(str(path)).run(None, feeds)


def assert_same_results(original: Path, optimized: Path, feeds: dict, rtol=1e-4, atol=1e-5) -> None:
    """The optimized model computes the original's outputs, on onnxruntime and on onnx.reference."""
    expected = run_onnxruntime(original, feeds)
    for runtime in (run_onnxruntime, run_reference):
        actual = runtime(optimized, feeds)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=runtime.__name__)


#: onnx's shape inference does no data propagation inside a function body, so it cannot follow the
#: Shape -> Concat -> Reshape of ChannelShuffle's body: it infers the element type only, and no shape for
#: what a ChannelShuffle output feeds. The writer records the shapes the engine inferred in value_info.
SHAPE_NOT_INFERRED = {"ChannelShuffle"}


def assert_typed_by_onnx(path: Path, *, shapes: bool = True) -> None:
    """onnx's checker accepts the model, the file holds a type for every value, and onnx's shape inference,
    from scratch, types every output of a mirserve op again (and gives it a shape, with ``shapes``)."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    recorded = {v.name for v in (*model.graph.value_info, *model.graph.output)}
    del model.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    typed = {v.name: v.type.tensor_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    for node in model.graph.node:
        if node.domain != "mirserve":
            continue
        for name in node.output:
            assert name in recorded, f"the file records no type for {name} of {node.op_type}"
            assert name in typed and typed[name].elem_type != 0, f"{name} of {node.op_type} is not typed"
            if shapes and node.op_type not in SHAPE_NOT_INFERRED:
                assert typed[name].HasField("shape"), f"{name} of {node.op_type} has no shape"
