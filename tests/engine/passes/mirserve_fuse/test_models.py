"""The default pipeline (fused ops included) on every real model: the IR stays consistent after every pass, the
output computes what the input computed (three seeded inputs, rtol 1e-4 / atol 1e-5, onnxruntime), onnx types
it, and a second run of the domain fusions finds nothing left to fuse."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.conftest import CORPUS, all_models, model_id, random_feeds, shapes_for
from tests.engine.passes.mirserve_fuse.helpers import assert_typed_by_onnx, run_reference
from worker.engine.ir import load_model, save_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.numeric import verify
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.passes.pipelines import DOMAIN_FUSE, get_pipeline
from worker.engine.places import parse_places


def op_types(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def optimize_verified(path, output, **options):
    """The default pipeline as ``optimize`` runs it, with the IR verified after every pass."""
    options = OptimizeOptions(input_shapes=shapes_for(path), **options)
    model = load_model(path)
    apply_input_shapes(model.graph, options.input_shapes)
    ctx = PassContext(model, options, parse_places(options.places))
    trace = PassManager(instruments=[VerifyInstrument()]).run(ctx, get_pipeline("default").steps_for(options))
    save_model(model, output)
    return ctx, trace


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_default_mode_keeps_results_and_leaves_nothing_to_fuse(tmp_path, path):
    output = tmp_path / "out.onnx"
    ctx, trace = optimize_verified(path, output)
    report = verify(str(path), str(output), input_shapes=shapes_for(path), runs=3, rtol=1e-4, atol=1e-5)
    assert report["passed"] is not False and report["runs"] == 3
    assert_typed_by_onnx(output, shapes="ChannelShuffle" not in op_types(output))
    again = PassManager(instruments=[VerifyInstrument()]).run(ctx, DOMAIN_FUSE)
    assert sum(entry["rewrites"] for entry in again) == 0


def test_onnx_reference_computes_the_fused_ops_of_a_real_model_like_the_ops_they_replace(tmp_path):
    """Default against --portable output of the same pipeline: they differ only by the fused ops. (Comparing
    with the input instead would measure onnx.reference's own BatchNormalization, which disagrees with
    onnxruntime on this model by 3e-2 before any rewrite.)"""
    path = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    fused, portable = tmp_path / "fused.onnx", tmp_path / "portable.onnx"
    optimize_verified(path, fused)
    optimize_verified(path, portable, portable=True)
    assert any(n.domain == "mirserve" for n in onnx.load(str(fused)).graph.node)
    assert not any(n.domain == "mirserve" for n in onnx.load(str(portable)).graph.node)
    feeds = random_feeds(path, shapes_for(path))
    for expected, actual in zip(run_reference(portable, feeds), run_reference(fused, feeds)):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
