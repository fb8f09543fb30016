"""The readable summary: built from a real run's report, printed as tables that fit the terminal, or as JSON."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.conftest import CORPUS
from worker.engine.cli import main
from worker.engine.memory.liveness import VIEW_OPS
from worker.engine.summary import build_summary, render_summary

CLS = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
ARM_PLACES = "arm/fp16/nhwc,arm/fp32/nchw"


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """The classifier on ARM fp16/NHWC: fused ops, layout and precision casts, a host fallback."""
    out = tmp_path_factory.mktemp("summary")
    report_path = out / "report.json"
    code = main(["optimize", str(CLS), "-o", str(out / "cls.onnx"), "--input-shape", "x=1,3,48,192",
                 "--places", ARM_PLACES, "--report", str(report_path), "--quiet"])
    assert code == 0
    return json.loads(report_path.read_text())


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    """The BERT encoder on ARM: shape arithmetic ARM has no kernel for falls back to host."""
    out = tmp_path_factory.mktemp("summary_bert")
    report_path = out / "report.json"
    code = main(["optimize", str(CORPUS / "bert_small_dyn.onnx"), "-o", str(out / "bert.onnx"), "--input-shape",
                 "input_ids=2,64", "--input-shape", "attention_mask=2,64", "--places", ARM_PLACES,
                 "--report", str(report_path), "--quiet", "--no-verify"])
    assert code == 0
    return json.loads(report_path.read_text())


@pytest.mark.models
def test_the_summary_accounts_for_every_node_before_and_after(cls_run):
    summary = cls_run["summary"]
    model = cls_run["model"]
    assert sum(r["before"] for r in summary["op_types"]) == model["input"]["nodes"] == summary["nodes"]["before"]
    assert sum(r["after"] for r in summary["op_types"]) == model["output"]["nodes"] == summary["nodes"]["after"]
    by_op = {r["op"]: r for r in summary["op_types"]}
    assert by_op["Conv"]["before"] > 0 and by_op["Conv"]["after"] == 0  # every Conv fused or made NHWC
    assert sum(summary["nodes_per_place"].values()) == model["output"]["nodes"]
    kinds = [c["cast"] for c in cls_run["kernels"]["casts"]]
    assert summary["casts"] == {"io_copy": kinds.count("io_copy"), "calib": kinds.count("calib"),
                                "layout": kinds.count("layout")}
    assert summary["casts"]["layout"] > 0 and summary["casts"]["calib"] > 0


@pytest.mark.models
def test_the_classifier_has_no_host_fallback_since_arm_runs_its_fused_ops(cls_run):
    # FusedConvHardSigmoid once fell back to host (no ARM kernel of its own); ARM now runs it because it runs
    # Conv, Mul, Add and Clip in fp16 (a kernel derived from the body). What is left on host is there by the
    # placement plan's choice (a listed place could run it, the casts around it there cost more), and says so,
    # or a view ARM's table leaves to the host (as Paddle-Lite runs reshape on host kernels over ARM memory).
    fallbacks = cls_run["summary"]["host_fallbacks"]
    assert fallbacks and all((f["kind"] == "plan" and f["user_place_possible"] == f["nodes"])
                             or (f["kind"] == "no kernel" and f["op"] in VIEW_OPS
                                 and f["reason"] == f"no kernel for {f['op']} on arm") for f in fallbacks), fallbacks
    on_host = [n["node"] for n in cls_run["kernels"]["nodes"]
               if n["place"].startswith("host/") and n["op"] not in ("mirserve.layout", "mirserve.calib")]
    assert sorted(on_host) == sorted(e for f in fallbacks for e in f["examples"])
    casts = cls_run["kernels"]["casts"]
    assert cls_run["summary"]["cast_bytes"] == {
        kind: sum(c["bytes"] for c in casts if c["cast"] == kind) for kind in ("io_copy", "calib", "layout")}
    assert all(isinstance(c["bytes"], int) and c["bytes"] > 0 for c in casts)


@pytest.mark.models
def test_host_fallbacks_name_the_op_and_why_no_listed_place_runs_it(bert_run):
    fallbacks = bert_run["summary"]["host_fallbacks"]
    on_host = [n for n in bert_run["kernels"]["nodes"]
               if n["place"].startswith("host/") and not n["op"] in ("mirserve.layout", "mirserve.calib",
                                                                      "mirserve.io_copy")]
    assert sum(f["nodes"] for f in fallbacks) == len(on_host) > 0
    for fallback in fallbacks:
        assert fallback["place"].startswith("host/") and fallback["examples"]
        assert fallback["kind"] in ("no kernel", "precision", "layout", "constraints", "rewrite", "pick", "plan")
        if fallback["kind"] == "no kernel":
            assert fallback["reason"] == f"no kernel for {fallback['op']} on arm"
    assert "no kernel" in {f["kind"] for f in fallbacks}
    # every node on host carries the reason place_report found for it
    assert all("fallback" in n for n in on_host)
    text = render_summary(bert_run["summary"], width=100)
    assert "host fallbacks" in text and max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.models
def test_memory_verification_and_macs_come_from_the_report(cls_run):
    summary, memory = cls_run["summary"], cls_run["memory"]
    (space,) = summary["memory_spaces"]
    (arena,) = memory["arenas"]
    assert space["arena_bytes"] == arena["arena_bytes"] and space["weights_bytes"] == memory["weights_bytes"]["host"]
    assert space["lower_bound_bytes"] <= space["arena_bytes"] <= space["paddle_lite_style_bytes"]
    assert summary["macs"] == memory["macs"]["total"] > 0
    verification = summary["verification"]
    assert verification["passed"] is True and verification["runs"] == 1
    assert verification["max_abs_diff"] == max(o["max_abs_diff"] for o in cls_run["verification"]["outputs"])
    assert all("by the placement plan" in w for w in summary["warnings"]), summary["warnings"]


@pytest.mark.models
@pytest.mark.parametrize("width", [48, 80, 160])
def test_tables_fit_the_terminal_width(cls_run, width):
    text = render_summary(cls_run["summary"], width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    flat = "".join(text.split())  # narrow tables fold long cells over several lines
    for words in ("op types", "nodes per place", "memory per space", "verification",
                  "mirserve.NhwcConv", "arm/fp16/nhwc", f"{cls_run['memory']['macs']['total']:,}", "layout 2 ("):
        assert "".join(words.split()) in flat, words


@pytest.mark.models
def test_the_cli_prints_tables_or_json(tmp_path, capsys):
    args = ["optimize", str(CLS), "-o", str(tmp_path / "cls.onnx"), "--input-shape", "x=1,3,48,192",
            "--no-verify", "--places", ARM_PLACES]
    assert main([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["nodes"]["before"] == 566 and printed["verification"]["passed"] is None
    assert printed["verification"]["skipped"] == "verification was turned off"
    assert all("by the placement plan" in w for w in printed["warnings"]), printed["warnings"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'cls.onnx'}: 566 -> ") and "nodes per place" in out
    assert "total" in out and "not verified" in out


def test_fallback_reasons_tell_a_missing_kernel_from_one_that_did_not_apply():
    report = {"options": {"places": "arm/fp16/nchw,cuda/fp16/nchw"},
              "kernels": {"nodes": [
                  {"node": "a", "op": "Erf", "kernel": "host:Erf:13-:fp32:any", "place": "host/fp32/nchw"},
                  {"node": "b", "op": "Erf", "kernel": "host:Erf:13-:fp32:any", "place": "host/fp32/nchw"},
                  {"node": "c", "op": "mirserve.NhwcConv", "kernel": "host:Conv:11-:fp32:any",
                   "place": "host/fp32/nchw"},
                  {"node": "d", "op": "mirserve.io_copy", "kernel": "host:mirserve.io_copy:1-:any:any",
                   "place": "host/fp32/nchw"},
                  {"node": "e", "op": "Relu", "kernel": "arm:Relu:14-:fp16:nchw", "place": "arm/fp16/nchw"}]}}
    registered = {("Conv", "arm")}
    summary = build_summary(report, has_kernel=lambda op, target: (op, target) in registered)
    assert summary["host_fallbacks"] == [
        {"op": "Erf", "place": "host/fp32/nchw", "nodes": 2, "examples": ["a", "b"], "kind": "no kernel",
         "reason": "no kernel for Erf on arm or cuda", "user_place_possible": 0},
        {"op": "Conv", "place": "host/fp32/nchw", "nodes": 1, "examples": ["c"], "kind": "constraints",
         "reason": "arm has Conv kernels, but none accepts this node's element types, attributes or opset; "
                   "cuda has none", "user_place_possible": 0}]
    assert summary["warnings"] == []


def test_recorded_fallbacks_keep_their_kind_a_rewritten_op_is_a_rewrite_and_an_avoidable_one_warns():
    report = {"options": {"places": "arm/fp16/nhwc"},
              "model": {"input": {"op_types": {"Conv": 1, "Sigmoid": 1, "Mul": 1, "Where": 1}}},
              "kernels": {"nodes": [
                  {"node": "w", "op": "Where", "kernel": "host:Where:16-:any:any", "place": "host/fp32/nchw",
                   "fallback": {"kind": "no kernel", "reason": "no kernel for Where on arm", "user_place": False}},
                  {"node": "f", "op": "mirserve.FusedConvSilu", "kernel": "host:mirserve.FusedConvSilu:1-:any:nchw",
                   "place": "host/fp16/nhwc",
                   "fallback": {"kind": "precision", "reason": "no fp16 kernel", "user_place": False}},
                  {"node": "m", "op": "Mul", "kernel": "host:Mul:14-:fp16:any", "place": "host/fp16/nhwc",
                   "fallback": {"kind": "pick", "reason": "arm:Mul applies", "user_place": True}},
                  # made by a rewrite, but on host by the plan's choice: the plan, not the rewrite, put it there
                  {"node": "r", "op": "ReduceMean", "kernel": "host:ReduceMean:1-12:fp16:nchw",
                   "place": "host/fp16/nchw",
                   "fallback": {"kind": "plan", "reason": "the placement plan chose the host", "user_place": True}}],
                  "places": {"host/fp32/nchw": 1, "host/fp16/nhwc": 2, "host/fp16/nchw": 1},
                  "casts": [{"node": "c1", "cast": "calib", "bytes": 100}, {"node": "c2", "cast": "calib", "bytes": 28},
                            {"node": "c3", "cast": "layout", "bytes": None}]}}
    summary = build_summary(report)
    kinds = {f["op"]: (f["kind"], f["user_place_possible"]) for f in summary["host_fallbacks"]}
    assert kinds == {"Where": ("no kernel", 0), "mirserve.FusedConvSilu": ("rewrite", 0), "Mul": ("pick", 1),
                     "ReduceMean": ("plan", 1)}
    rewrite = next(f for f in summary["host_fallbacks"] if f["kind"] == "rewrite")
    assert rewrite["reason"] == "a rewrite made mirserve.FusedConvSilu: no fp16 kernel"
    assert summary["cast_bytes"] == {"io_copy": 0, "calib": 128, "layout": None}
    planned, possible, rewritten = summary["warnings"]
    assert planned.startswith("1 node(s) on host by the placement plan although a place you listed could run")
    assert possible == "1 node(s) fell back to host where a place you listed was possible: Mul (pick: m)"
    assert rewritten == ("1 node(s) fell back to host on ops a rewrite made, which no place you listed runs: "
                         "mirserve.FusedConvSilu (f)")
    text = render_summary(summary, width=200)
    assert "calib 2 (128 B)" in text and "rewrite" in text


def test_a_host_node_the_placement_plan_chose_is_told_from_a_fallback():
    report = {"options": {"places": "arm/fp16/nhwc,arm/fp32/nchw"},
              "kernels": {"nodes": [{"node": "r", "op": "Resize", "kernel": "host:Resize:11-12:any:nchw",
                                     "place": "host/fp16/nchw"}]},
              "placement": {"cost": 10.0, "greedy_cost": 12.0, "lower_bound": 9.0, "method": "local search",
                            "casts": {"count": 2, "bytes": 64}, "greedy_casts": {"count": 4, "bytes": 96},
                            "host_by_choice": {"Resize": 1}}}
    summary = build_summary(report, has_kernel=lambda op, target: True)
    assert summary["host_fallbacks"][0]["reason"] == ("the placement plan chose the host: arm could run it, but "
                                                      "the casts around it there cost more")
    assert summary["placement"]["casts"] == {"count": 2, "bytes": 64}
    assert "placement cost" in render_summary(summary, width=100)


def test_a_host_place_the_user_listed_is_no_fallback():
    report = {"options": {"places": "arm/fp32/nchw,host/fp32/nchw"},
              "kernels": {"nodes": [{"node": "a", "op": "Erf", "kernel": "host:Erf:13-:fp32:any",
                                     "place": "host/fp32/nchw"}]}}
    assert build_summary(report)["host_fallbacks"] == []


def test_an_empty_report_gives_an_empty_summary_that_still_renders():
    summary = build_summary({})
    assert summary["op_types"] == [] and summary["memory_spaces"] == [] and summary["host_fallbacks"] == []
    assert "not verified" in render_summary(summary, width=60)


def test_unknown_macs_are_null_with_the_reason_never_zero():
    unknown = [{"node": f"c{i}", "op": "Conv", "reason": "Conv: the shape of its output 0 is [batch, 4, ?, 8]"}
               for i in range(2)] + [{"node": "x", "op": "com.acme.Op", "reason": "com.acme.Op is neither ..."}]
    summary = build_summary({"memory": {"macs": {"total": None, "known_total": 1200, "nodes": [],
                                                 "unknown": unknown}}})
    assert summary["macs"] is None and summary["macs_unknown_nodes"] == 3
    assert summary["macs_unknown"] == ["Conv: the shape of its output 0 is [batch, 4, ?, 8] (node c0)",
                                       "com.acme.Op is neither ... (node x)"]
    flat = " ".join(render_summary(summary, width=400).split())
    assert "MACs unknown: 3 node(s) cannot be counted (1,200 in the others): Conv: the shape" in flat


def test_an_op_of_an_if_body_on_host_is_not_said_to_be_made_by_a_rewrite(tmp_path):
    """A detector's NonMaxSuppression inside an If: no ARM place runs it, which is a plain host fallback; the
    summary took it for an op a rewrite made (it counted the main graph's op types only) and warned."""
    from onnx import TensorProto, helper, numpy_helper

    from worker.engine.api import optimize
    from worker.engine.options import OptimizeOptions

    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 8, 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 8])
    selected = helper.make_tensor_value_info("sel", TensorProto.INT64, [None, 3])
    then = helper.make_graph([helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["t"])], "then",
                             [], [helper.make_tensor_value_info("t", TensorProto.INT64, [None, 3])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(
        np.zeros((0, 3), np.int64)))], "else", [], [helper.make_tensor_value_info("e", TensorProto.INT64, [None, 3])])
    nodes = [helper.make_node("ReduceMax", ["scores"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "threshold"], ["cond"]),
             helper.make_node("If", ["cond"], ["sel"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "if_nms", [boxes, scores], [selected], [
        numpy_helper.from_array(np.array([4], np.int64), "k"), numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
        numpy_helper.from_array(np.array(0.0, np.float32), "threshold")])
    source = tmp_path / "in.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(source))
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places="arm/fp16/nhwc,arm/fp32/nchw"))
    [nms] = [f for f in report["summary"]["host_fallbacks"] if f["op"] == "NonMaxSuppression"]
    assert nms["kind"] == "no kernel", nms
    assert not [w for w in report["summary"]["warnings"] if "a rewrite made" in str(w)]
    assert report["model"]["input"]["op_types_in_bodies"] == {"NonMaxSuppression": 1, "Constant": 1}


def test_a_body_node_on_host_is_not_said_to_have_had_a_listed_place_its_parent_could_not_lend(tmp_path):
    """A host-run If lends its body only the listed targets that share host memory: under npu places an
    int64 Cast in the body was said to have had npu within reach ("a place you listed was possible")."""
    from onnx import TensorProto, helper, numpy_helper

    from worker.engine.api import optimize
    from worker.engine.options import OptimizeOptions

    then = helper.make_graph([helper.make_node("Cast", ["labels"], ["t"], to=TensorProto.FLOAT)], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [8])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(
        np.zeros(8, np.float32)))], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [8])])
    nodes = [helper.make_node("ArgMax", ["scores"], ["labels2d"], axis=1, keepdims=0),
             helper.make_node("Reshape", ["labels2d", "shape8"], ["labels"]),
             helper.make_node("ReduceMax", ["scores"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "threshold"], ["cond"]),
             helper.make_node("If", ["cond"], ["f"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "if_cast", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [8, 5])],
                              [helper.make_tensor_value_info("f", TensorProto.FLOAT, [8])],
                              [numpy_helper.from_array(np.array([8], np.int64), "shape8"),
                               numpy_helper.from_array(np.array(0.0, np.float32), "threshold")])
    source = tmp_path / "in.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(source))
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places="npu/int8/nchw,arm/fp32/nchw"))
    [cast] = [f for f in report["summary"]["host_fallbacks"] if f["op"] == "Cast"]
    assert cast["user_place_possible"] == 0 and "npu" not in cast["reason"], cast
    assert not [w for w in report["summary"]["warnings"] if "was possible" in str(w)]
