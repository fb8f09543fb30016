"""The cleanup passes rewrite Loop and Scan bodies too, keeping the body's formal outputs."""
import numpy as np
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run
from worker.engine.passes import FixedPoint
from worker.engine.passes.pipelines import CLEANUP

STEPS = [FixedPoint("cleanup", CLEANUP)]


def test_loop_body_is_cleaned(tmp_path):
    body_nodes = [helper.make_node("Constant", [], ["k"], value_floats=[1.0, 2.0]),
                  helper.make_node("Mul", ["k", "k"], ["kk"]),
                  helper.make_node("Cast", ["carried"], ["same"], to=TensorProto.FLOAT),
                  helper.make_node("Identity", ["same"], ["copy"]),
                  helper.make_node("Add", ["copy", "kk"], ["sum"]),
                  helper.make_node("Mul", ["sum", "one"], ["next"]),
                  helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = helper.make_graph(body_nodes, "body",
                             [vinfo("i", TensorProto.INT64, []), vinfo("cond_in", TensorProto.BOOL, []),
                              vinfo("carried", shape=[2])],
                             [vinfo("cond_out", TensorProto.BOOL, []), vinfo("next", shape=[2])])
    loop = helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)
    model = make_model([loop], [vinfo("x", shape=[2])], [vinfo("y", shape=[2])],
                       [tensor("trips", np.array(3, np.int64)), tensor("one", np.float32(1))])
    outcome = run(model, STEPS, tmp_path)
    inner = outcome.model.graph.nodes_of_type("Loop")[0].attr("body")
    assert [n.op_type for n in inner] == ["Add", "Identity"]  # the cond pass-through must stay: both ends are formal
    assert [v.name for v in inner.outputs] == ["cond_out", "next"]


def test_scan_body_is_cleaned(tmp_path):
    body_nodes = [helper.make_node("Transpose", ["row"], ["t"], perm=[0]),
                  helper.make_node("Add", ["acc", "t"], ["acc_out"]),
                  helper.make_node("Identity", ["acc_out"], ["scan_out"])]
    body = helper.make_graph(body_nodes, "body", [vinfo("acc", shape=[3]), vinfo("row", shape=[3])],
                             [vinfo("acc_out", shape=[3]), vinfo("scan_out", shape=[3])])
    scan = helper.make_node("Scan", ["init", "rows"], ["final", "all"], body=body, num_scan_inputs=1)
    model = make_model([scan], [vinfo("init", shape=[3]), vinfo("rows", shape=[4, 3])],
                       [vinfo("final", shape=[3]), vinfo("all", shape=[4, 3])])
    outcome = run(model, STEPS, tmp_path)
    inner = outcome.model.graph.nodes_of_type("Scan")[0].attr("body")
    assert [n.op_type for n in inner] == ["Add", "Identity"]  # acc_out and scan_out are both formal outputs
