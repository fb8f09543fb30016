"""fuse_consecutive_transposes: two Transposes compose into one, or vanish when they cancel."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_transposes"]


def chain(p1, p2, out_shape, extra_reader=False):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=p1),
             helper.make_node("Transpose", ["t"], ["u"], **({"perm": p2} if p2 is not None else {})),
             helper.make_node("Neg", ["u"], ["y"])]
    outputs = [vinfo("y", shape=list(out_shape))]
    if extra_reader:
        nodes.append(helper.make_node("Abs", ["t"], ["z"]))
        outputs.append(vinfo("z", shape=list(np.empty((2, 3, 4)).transpose(p1).shape)))
    return make_model(nodes, [vinfo("x", shape=[2, 3, 4])], outputs)


def test_transposes_that_cancel_vanish(tmp_path):
    outcome = run(chain([0, 2, 1], [0, 2, 1], (2, 3, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_transposes_compose_into_one(tmp_path):
    outcome = run(chain([1, 0, 2], [2, 0, 1], (4, 3, 2)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Transpose", "Neg"]
    assert outcome.model.graph.nodes_of_type("Transpose")[0].attr("perm") == [2, 1, 0]


def test_default_permutation_is_the_reversal(tmp_path):
    outcome = run(chain([2, 1, 0], None, (2, 3, 4)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_first_transpose_read_elsewhere_stays(tmp_path):
    outcome = run(chain([1, 0, 2], [1, 0, 2], (2, 3, 4), extra_reader=True), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Transpose", "Neg", "Abs"]
    assert outcome.model.graph.nodes_of_type("Neg")[0].input(0).name == "a"
