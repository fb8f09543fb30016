"""eliminate_nop_expand: Expand to the input's own shape goes, even with symbolic dims."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["eliminate_nop_expand"]


def expand_model(target, x_shape=("n", 3), out_shape=("n", 3)):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Expand", ["a", "shape"], ["b"]),
             helper.make_node("Neg", ["b"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], [vinfo("y", shape=list(out_shape))],
                      [tensor("shape", np.array(target, np.int64))])


def test_expand_by_ones_is_removed_with_a_symbolic_batch(tmp_path):
    outcome = run(expand_model([1, 1]), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_expand_to_the_static_input_shape_is_removed(tmp_path):
    outcome = run(expand_model([2, 3], x_shape=(2, 3), out_shape=(2, 3)), STEP, tmp_path)
    assert outcome.ops == ["Relu", "Neg"]


def test_a_real_broadcast_stays(tmp_path):
    outcome = run(expand_model([4, 2, 3], x_shape=(2, 3), out_shape=(4, 2, 3)), STEP, tmp_path)
    assert "Expand" in outcome.ops and outcome.refusals("eliminate_nop_expand") == {}


def test_expand_to_a_shape_fed_at_run_time_is_refused(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Expand", ["a", "s"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[1, 3]), vinfo("s", 7, [2])], [vinfo("y", shape=["a", 3])])
    outcome = run(model, STEP, tmp_path, check=False)
    assert outcome.refused("eliminate_nop_expand", "not known to be equal")
