"""The simplify fixed point (cleanup, fusions, replacements) on every real model: the IR stays consistent
after every pass, every value stays typed, the node count never grows, and the outputs agree with the input
model within rtol 1e-4 / atol 1e-5 on three seeded random inputs (onnxruntime, in a child process)."""
from __future__ import annotations

import pytest

from tests.conftest import all_models, model_id, shapes_for
from tests.engine.passes.fuse.harness import assert_typed
from worker.engine.ir import load_model, save_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.numeric import verify
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.passes.pipelines import CHAINS, FUSE, REPLACE, SIMPLIFY, FixedPoint
from worker.engine.places import parse_places


def simplify(path, out_path):
    model = load_model(path)
    before = len(model.graph)
    apply_input_shapes(model.graph, shapes_for(path))
    options = OptimizeOptions(portable=True, input_shapes=shapes_for(path))
    ctx = PassContext(model, options, parse_places(options.places))
    trace = PassManager(instruments=[VerifyInstrument()]).run(
        ctx, ["type_inference", FixedPoint("simplify", SIMPLIFY, max_iterations=8)])
    assert_typed(model)
    save_model(model, out_path)
    return before, len(model.graph), trace


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_simplify_keeps_the_outputs(tmp_path, path):
    out_path = tmp_path / "out.onnx"
    before, after, trace = simplify(path, out_path)
    assert after <= before
    report = verify(str(path), str(out_path), input_shapes=shapes_for(path), runs=3)
    assert report["passed"] is True, report


def rewrites(trace, names) -> dict:
    counts: dict = {}
    for entry in trace:
        if entry["pass"] in names and entry.get("rewrites"):
            counts[entry["pass"]] = counts.get(entry["pass"], 0) + entry["rewrites"]
    return counts


def test_the_pp_ocr_detector_loses_its_bn_affine_and_hard_swish_chains(tmp_path):
    from tests.conftest import CORPUS

    before, after, trace = simplify(CORPUS / "ch_PP-OCRv4_det_infer.onnx", tmp_path / "out.onnx")
    done = rewrites(trace, set(CHAINS) | set(FUSE) | set(REPLACE))
    # 24 paddle2onnx hard-swish chains, conv + scalar Mul/Add of the MobileOne blocks, the BN of the head
    assert done["hard_swish_fuse"] == 24 and done["conv_bn_fuse"] == 3
    assert done["conv_scale_fuse"] >= 28 and done["conv_elementwise_fuse"] >= 30
    assert after <= before - 3 * 24 - 28 - 30
