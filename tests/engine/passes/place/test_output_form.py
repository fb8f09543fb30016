"""What the written model says: node and model metadata, own-domain functions, IR version; and the trace."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.conftest import CORPUS, CORPUS_SHAPES, make_model, random_feeds, run_onnxruntime, save_proto, vinfo
from tests.engine.passes.place.helpers import check_annotations, place_model, trace_entry
from worker.engine.api import OptimizeOptions, optimize
from worker.engine.ir import save_model


def test_the_written_model_records_kernels_places_and_how_it_was_made(tmp_path):
    name = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    out = tmp_path / "cls.onnx"
    report = optimize(CORPUS / name, out, OptimizeOptions(places="arm/fp16/nhwc,arm/fp32/nchw",
                                                          input_shapes=CORPUS_SHAPES[name]))
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert 10 <= model.ir_version <= 13  # node metadata needs IR 10; onnxruntime 1.31 loads up to 13
    for node in model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        assert props.get("mirserve.kernel") and props.get("mirserve.place"), node.name
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["mirserve.valid_places"] == "arm/fp16/nhwc,arm/fp32/nchw,host/fp16/nhwc,host/fp32/nchw"
    assert meta["mirserve.pipeline"].startswith("default: type_inference,filter_pre,support_check,")
    assert "static_kernel_pick,variable_place_inference,type_target_cast" in meta["mirserve.pipeline"]
    used = {n.op_type for n in model.graph.node if n.domain == "mirserve"}
    assert used == {f.name for f in model.functions} >= {"calib", "layout", "NhwcConv"}
    kernels = report["kernels"]
    assert kernels["counts"]["nodes"] == len(model.graph.node) == kernels["counts"]["annotated"]
    assert sum(kernels["places"].values()) == len(model.graph.node)
    assert {c["cast"] for c in kernels["casts"]} == {"calib", "layout"}
    first = kernels["casts"][0]
    assert set(first) == {"node", "cast", "value", "from", "to", "bytes"} and first["from"] != first["to"]


def test_onnx_reference_runs_the_result_as_it_runs_the_input(tmp_path):
    name = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    ctx = place_model(CORPUS / name, "arm/fp16/nhwc,arm/fp32/nchw", shapes=CORPUS_SHAPES[name],
                      verify_ir=False)
    out = tmp_path / "cls.onnx"
    save_model(ctx.model, out)
    feeds = random_feeds(CORPUS / name, CORPUS_SHAPES[name], seed=3)
    # The reference is onnxruntime on the input: onnx.reference itself computes this model's opset-11
    # BatchNormalization differently (0.10 off at the first one, 0.53 instead of 0.63 at the output), and
    # the pipeline folds every BatchNormalization into its conv.
    expected = run_onnxruntime(CORPUS / name, feeds)[0]
    got = ReferenceEvaluator(str(out)).run(None, feeds)[0]
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=1e-2, atol=5e-3)


def test_the_trace_keeps_every_nodes_top_candidates(tmp_path):
    name = "ch_PP-OCRv4_det_infer.onnx"
    ctx = place_model(CORPUS / name, "arm/fp16/nhwc,arm/fp32/nchw", shapes=CORPUS_SHAPES[name],
                      verify_ir=False)
    entry = trace_entry(ctx, "static_kernel_pick")
    details = entry["details"]
    assert len(details) == entry["nodes_before"] == len({d["node"] for d in details}) > 100
    for entry in details:  # the pick first, then the cheapest other options
        costs = [c["cost"] for c in entry["candidates"]]
        assert 1 <= len(costs) <= 3 and costs[1:] == sorted(costs[1:])
        assert entry["candidates"][0]["kernel"] == entry["kernel"]
        assert all(c["score"] > 0 and c["place"] for c in entry["candidates"])
    conv = next(d for d in details if d["op"] == "Conv")
    assert conv["kernel"] == "arm:Conv:1-21:fp16:nhwc" and conv["candidates"][0]["score"] > 1700


def test_nodes_inside_if_bodies_get_kernels(tmp_path):
    then_graph = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vinfo("t", shape=[4])])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vinfo("e", shape=[4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    model = make_model(nodes, [vinfo("x", shape=[4])], [vinfo("y", shape=[4])], [zero])
    source = save_proto(model, tmp_path / "if.onnx")
    ctx = place_model(source, "arm/fp32/nchw")
    check_annotations(ctx.graph)
    body_nodes = [n for n in ctx.graph.all_nodes() if n.graph is not ctx.graph]
    assert {n.op_type for n in body_nodes} == {"Relu", "Neg"}
    assert {n.metadata["mirserve.place"].split("/")[0] for n in body_nodes} <= {"arm", "host"}
    save_model(ctx.model, tmp_path / "out.onnx")
    x = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    got = onnxruntime.InferenceSession(str(tmp_path / "out.onnx")).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.maximum(x, 0))
