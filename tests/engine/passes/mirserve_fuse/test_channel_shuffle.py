"""shuffle_channel_fuse: Reshape-Transpose-Reshape becomes ChannelShuffle only when it really shuffles channels."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import LIGHT, make_model, tensor, vinfo
from tests.engine.passes.mirserve_fuse.helpers import (assert_same_results, assert_typed_by_onnx, op_counts, refusals,
                                         run_passes)
from worker.engine.passes.mirserve_fuse.shuffle_channel_fuse import shuffle_groups

make = helper.make_node
PASS = ["shuffle_channel_fuse"]


def shuffle_model(split, perm, merge, *, x_shape=(1, 12, 4, 4), opset=13, out_shape=None, extra=()):
    nodes = [make("Reshape", ["x", "split_shape"], ["a"]), make("Transpose", ["a"], ["b"], perm=perm),
             make("Reshape", ["b", "merge_shape"], ["y"]), *extra]
    outputs = [vinfo("y", shape=out_shape or list(x_shape))]
    outputs += [vinfo(n.output[0], shape=[1, 4, 3, 4, 4]) for n in extra]
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], outputs,
                      [tensor("split_shape", np.array(split, np.int64)),
                       tensor("merge_shape", np.array(merge, np.int64))], opset=opset)


def feeds(shape=(1, 12, 4, 4)):
    return {"x": np.arange(np.prod(shape), dtype=np.float32).reshape(shape)}


@pytest.mark.parametrize("opset", [9, 11, 12, 17])  # group as a tensor: EyeLike before 12, Constant from 12
def test_shuffle_becomes_one_op_that_both_runtimes_run(tmp_path, opset):
    model = shuffle_model([1, 3, 4, 4, 4], [0, 2, 1, 3, 4], [1, 12, 4, 4], opset=opset)
    output, trace = run_passes(model, tmp_path, PASS)
    assert op_counts(output) == {"mirserve.ChannelShuffle": 1}
    node = onnx.load(str(output)).graph.node[0]
    assert helper.get_attribute_value(node.attribute[0]) == 3
    assert not onnx.load(str(output)).graph.initializer, "the shape constants are gone with the reshapes"
    assert_same_results(tmp_path / "in.onnx", output, feeds())
    assert_typed_by_onnx(output)


def test_flattened_trailing_axes_and_dynamic_batch_still_shuffle(tmp_path):
    model = shuffle_model([0, 4, 3, 16], [0, 2, 1, 3], [0, 12, 4, 4], x_shape=("n", 12, 4, 4),
                          out_shape=["n", 12, 4, 4])
    output, trace = run_passes(model, tmp_path, PASS)
    assert op_counts(output) == {"mirserve.ChannelShuffle": 1}, refusals(trace)
    assert_same_results(tmp_path / "in.onnx", output, feeds((2, 12, 4, 4)))


def test_shufflenet_shuffles_are_all_fused(tmp_path):
    output, trace = run_passes(onnx.load(str(LIGHT / "light_shufflenet.onnx")), tmp_path, PASS)
    counts = op_counts(output)
    assert counts["mirserve.ChannelShuffle"] == 16 and "Transpose" not in counts
    assert trace[-1]["rewrites"] == 16 and not refusals(trace)


@pytest.mark.parametrize("split, perm, merge, reason", [
    ([1, 3, 4, 4, 4], [0, 1, 2, 3, 4], [1, 12, 4, 4], "does not swap just the two group axes"),
    ([1, 3, 4, 4, 4], [0, 2, 1, 4, 3], [1, 12, 4, 4], "does not swap just the two group axes"),
    ([1, 12, 2, 2, 4], [0, 2, 1, 3, 4], [1, 12, 4, 4], "does not split the channel axis into groups"),
    ([1, 3, 4, 4, 4], [0, 2, 1, 3, 4], [1, 12, 16], "not the input's shape [1, 12, 4, 4]"),
    ([1, 1, 12, 4, 4], [0, 2, 1, 3, 4], [1, 12, 4, 4], "with 1 group(s) of 12 channel(s)"),
    ([1, 12, 1, 4, 4], [0, 2, 1, 3, 4], [1, 12, 4, 4], "with 12 group(s) of 1 channel(s)"),
])
def test_shapes_that_do_not_describe_a_shuffle_are_refused(tmp_path, split, perm, merge, reason):
    out_shape = [1, 12, 16] if len(merge) == 3 else None
    output, trace = run_passes(shuffle_model(split, perm, merge, out_shape=out_shape), tmp_path, PASS)
    assert op_counts(output) == {"Reshape": 2, "Transpose": 1}
    assert any(reason in r for r in refusals(trace)), refusals(trace)


def test_intermediate_read_elsewhere_is_refused(tmp_path):
    model = shuffle_model([1, 3, 4, 4, 4], [0, 2, 1, 3, 4], [1, 12, 4, 4],
                          extra=[make("Identity", ["b"], ["b_copy"])])
    output, trace = run_passes(model, tmp_path, PASS)
    assert op_counts(output) == {"Reshape": 2, "Transpose": 1, "Identity": 1}
    assert "ChannelShuffle: the intermediate 'b' is also read by Identity" in " ".join(refusals(trace))


def test_shuffle_groups_reads_symbolic_and_unknown_shapes():
    from worker.engine.ir import Value
    x, split, merged = Value("x", 1, ("n", 8, 5)), Value("a", 1, ("n", 2, 4, 5)), Value("y", 1, ("n", 8, 5))
    assert shuffle_groups(x, split, [0, 2, 1, 3], merged) == 2
    split.shape = ("m", 2, 4, 5)  # another batch symbol: nothing proves the batch is kept
    assert "does not split the channel axis" in shuffle_groups(x, split, [0, 2, 1, 3], merged)
    merged.shape = None
    assert shuffle_groups(x, split, [0, 2, 1, 3], merged) == "the shapes around it are not known"
