"""place_report's reason for each node on a host place the user did not list (issue 12): the kind (no kernel,
precision, layout, constraints, pick) and whether a place the user listed could run it."""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from worker.engine.api import optimize
from worker.engine.options import OptimizeOptions


def _model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 3, 3], [0.01 * i for i in range(144)])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Greater", ["s", "c"], ["g"], name="gt"),
             helper.make_node("Where", ["g", "s", "c"], ["y"], name="where")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "in.onnx"
    onnx.save(model, str(path))
    return path


def test_each_host_node_says_why_no_listed_place_runs_it(tmp_path):
    report = optimize(_model(tmp_path), tmp_path / "out.onnx", OptimizeOptions(places="arm/fp16/nhwc", verify=False))
    fallbacks = {n["node"]: n["fallback"] for n in report["kernels"]["nodes"] if "fallback" in n}
    assert "conv" not in fallbacks                    # ARM runs it in fp16 NHWC
    assert fallbacks["sig"]["kind"] == "precision"   # ARM's Sigmoid is fp32 only
    assert fallbacks["where"] == {"kind": "no kernel", "reason": "no kernel for Where on arm", "user_place": False}
    assert not any(f["user_place"] for f in fallbacks.values())
    summary = report["summary"]
    kinds = {f["op"]: f["kind"] for f in summary["host_fallbacks"]}
    assert kinds["Sigmoid"] == "precision" and kinds["Where"] == "no kernel"


def test_a_listed_host_place_records_no_fallback(tmp_path):
    report = optimize(_model(tmp_path), tmp_path / "out.onnx",
                      OptimizeOptions(places="arm/fp16/nhwc,host/fp32/nchw", verify=False))
    assert not any("fallback" in n for n in report["kernels"]["nodes"])
    assert report["summary"]["host_fallbacks"] == []


def test_a_kernel_of_the_right_precision_in_another_layout_is_a_layout_miss():
    from worker.engine.kernels.table import default_table
    from worker.engine.passes.place.place_report import _refusal_kind
    from worker.engine.places import parse_places

    user = parse_places("arm/fp16/nhwc", host_fallback=False)
    kinds = {k.id: _refusal_kind(k, "", user) for k in default_table().kernels("Conv", targets=["arm"], opset=17)
             if k.layout.value == "nchw"}
    assert kinds == {"arm:Conv:1-21:fp32:nchw": "precision", "arm:Conv:1-21:fp16:nchw": "layout"}


def test_float_data_movement_runs_on_x86_where_onnxruntime_registers_it(tmp_path):
    """onnxruntime's CPU provider registers Transpose, Concat, Slice, Split, Gather and Clip over every element
    type in one kernel each: on x86 they run there in fp32, with no host fallback."""
    model = onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 8, 6] x) => (float[2, 6, 2] y, float[2, 6, 3] z, float[3, 8, 6] w) <int64[3] idx = {0, 1, 0}> {
            t = Transpose <perm = [0, 2, 1]> (x)
            a, b = Split <axis = 2> (t)
            c = Concat <axis = 2> (a, b)
            starts = Constant <value = int64[1] {0}> ()
            ends = Constant <value = int64[1] {2}> ()
            axes = Constant <value = int64[1] {2}> ()
            s = Slice (c, starts, ends, axes)
            y = Clip (s)
            z = Relu (a)
            g = Gather (x, idx)
            w = Neg (g)
        }''')
    onnx.save(model, tmp_path / "in.onnx")
    report = optimize(tmp_path / "in.onnx", tmp_path / "out.onnx", OptimizeOptions(places="x86/fp32/nchw"))
    placed = {n["op"]: n["place"] for n in report["kernels"]["nodes"]}
    assert {op: placed[op] for op in ("Transpose", "Split", "Concat", "Slice", "Clip", "Gather")} == \
        dict.fromkeys(("Transpose", "Split", "Concat", "Slice", "Clip", "Gather"), "x86/fp32/nchw")
    assert report["summary"]["host_fallbacks"] == []
