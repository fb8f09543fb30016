"""The CLEANUP passes through the manager on every corpus and light model: the IR stays consistent after
every pass, every value stays typed, the outputs agree with the input model on three seeded random inputs
(rtol 1e-4, atol 1e-5), and the node count is at or below onnxoptimizer's on the same model."""
from __future__ import annotations

import pytest

from tests.conftest import all_models, light_models, model_id, shapes_for
from tests.engine.passes.fold.harness import assert_typed
from worker.engine.ir import load_model, save_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.numeric import verify
from worker.engine.options import OptimizeOptions
from worker.engine.passes import FixedPoint, PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.passes.pipelines import CLEANUP
from worker.engine.places import parse_places

#: Top-level node counts after onnxoptimizer's default passes, measured with ../shared/bench/peers.py.
ONNXOPTIMIZER_NODES = {
    "bert_small_dyn": 215, "ch_PP-OCRv4_det_infer": 348, "ch_ppocr_mobile_v2.0_cls_infer": 572, "cls_qdq": 876,
    "light_bvlc_alexnet": 40, "light_densenet121": 1746, "light_inception_v1": 237, "light_inception_v2": 916,
    "light_resnet50": 415, "light_shufflenet": 446, "light_squeezenet": 105, "light_vgg19": 82,
    "light_zfnet512": 38,
}
LIGHT = {model_id(p) for p in light_models()}


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_cleanup_keeps_outputs_and_beats_onnxoptimizer(path, tmp_path):
    model = load_model(path)
    apply_input_shapes(model.graph, shapes_for(path))
    ctx = PassContext(model, OptimizeOptions(), parse_places(OptimizeOptions().places))
    trace = PassManager(instruments=[VerifyInstrument()]).run(
        ctx, ["type_inference", FixedPoint("cleanup", CLEANUP, max_iterations=8)])
    assert trace[-1]["converged"], "the cleanup passes did not reach a fixed point"
    assert_typed(model)
    out = tmp_path / "out.onnx"
    try:
        save_model(model, out)
        report = verify(str(path), str(out), input_shapes=shapes_for(path), runs=3, rtol=1e-4, atol=1e-5)
    finally:
        out.unlink(missing_ok=True)  # the light models fold to hundreds of MB
    assert report["passed"] is True and report["runs"] == 3
    assert len(model.graph) <= ONNXOPTIMIZER_NODES[model_id(path)]
    if model_id(path) in LIGHT:  # every weight made by ConstantOfShape is folded
        assert not model.graph.nodes_of_type("ConstantOfShape")
        assert len(model.graph) < ONNXOPTIMIZER_NODES[model_id(path)]
