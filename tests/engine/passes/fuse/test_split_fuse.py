"""split_fuse: sibling Slices that tile a tensor along one axis become one Split; gaps, overlaps, steps and
dynamic dims are refused or left alone."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import optimize

PASS = "split_fuse"


def sliced(parts, *, axis=-1, opset=17, steps=None, shape=(2, 3, 8), after=True):
    """x -> one Slice per (start, end) of ``parts`` along ``axis`` -> each through a Relu (its reader)."""
    nodes, inits, outputs = [], [], []
    for i, (start, end) in enumerate(parts):
        names = [f"s{i}", f"e{i}", f"a{i}"]
        inits += [tensor(names[0], np.array([start], np.int64)), tensor(names[1], np.array([end], np.int64)),
                  tensor(names[2], np.array([axis], np.int64))]
        if steps:
            names.append(f"st{i}")
            inits.append(tensor(f"st{i}", np.array([steps[i]], np.int64)))
        if opset < 10:
            nodes.append(helper.make_node("Slice", ["x"], [f"p{i}"], name=f"slice{i}", starts=[start], ends=[end],
                                          axes=[axis]))
        else:
            nodes.append(helper.make_node("Slice", ["x", *names], [f"p{i}"], name=f"slice{i}"))
        nodes.append(helper.make_node("Relu", [f"p{i}"], [f"y{i}"]))
        outputs.append(f"y{i}")
    if opset < 10:
        inits = []
    return inferred_model(nodes, [vinfo("x", shape=list(shape))], outputs, inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 11, 17, 23])
def test_two_halves_become_one_split(tmp_path, opset):
    out = optimize(tmp_path, sliced([(0, 4), (4, 8)], opset=opset), [PASS])
    assert out.ops == ["Split", "Relu", "Relu"]
    split = out.node("Split")
    assert [v.name for v in split.outputs] == ["p0", "p1"] and split.attr("axis") == 2
    lengths = split.attr("split") if opset < 13 else list(split.input(1).constant_value())
    assert list(lengths) == [4, 4]


def test_unsorted_parts_with_open_end_and_negative_start(tmp_path):
    """Slices in any graph order, written with INT64_MAX ends and negative starts, as exporters write them."""
    out = optimize(tmp_path, sliced([(-2, 2**63 - 1), (0, 3), (3, -2)]), [PASS])
    assert out.ops == ["Split", "Relu", "Relu", "Relu"]
    split = out.node("Split")
    assert [v.name for v in split.outputs] == ["p1", "p2", "p0"]
    assert list(split.input(1).constant_value()) == [3, 3, 2]


def test_middle_axis(tmp_path):
    out = optimize(tmp_path, sliced([(0, 1), (1, 3)], axis=1), [PASS])
    assert out.ops == ["Split", "Relu", "Relu"] and out.node("Split").attr("axis") == 1


def test_a_gap_is_refused(tmp_path):
    out = optimize(tmp_path, sliced([(0, 3), (4, 8)]), [PASS])
    assert out.ops.count("Slice") == 2
    assert out.refused("the Slices of 'x' along axis 2 (0:3, 4:8) do not cover its 8 elements exactly once")


def test_an_overlap_is_refused(tmp_path):
    out = optimize(tmp_path, sliced([(0, 5), (4, 8)]), [PASS])
    assert out.ops.count("Slice") == 2 and out.refused("(0:5, 4:8) do not cover its 8 elements exactly once")


def test_a_single_slice_stays(tmp_path):
    assert optimize(tmp_path, sliced([(0, 4)]), [PASS]).ops == ["Slice", "Relu"]


def test_steps_are_left_alone(tmp_path):
    out = optimize(tmp_path, sliced([(0, 4), (4, 8)], steps=[1, 2]), [PASS])
    assert out.ops.count("Slice") == 2


def sequence_split(positions, *, split=None, keepdims=1, shape=(2, 12), opset=17, reader="SequenceAt"):
    """x -> SplitToSequence(split, axis=1) -> SequenceAt at each of ``positions`` -> Relu."""
    inits = [] if split is None else [tensor("split", np.array(split, np.int64))]
    nodes = [helper.make_node("SplitToSequence", ["x", *(["split"] if split is not None else [])], ["seq"],
                              name="to_sequence", axis=1, keepdims=keepdims)]
    outputs = []
    for i, position in enumerate(positions):
        inits.append(tensor(f"pos{i}", np.array(position, np.int64)))
        if reader == "SequenceAt" or i:
            nodes.append(helper.make_node("SequenceAt", ["seq", f"pos{i}"], [f"c{i}"]))
        else:
            nodes.append(helper.make_node("SequenceLength", ["seq"], [f"c{i}"]))
        nodes.append(helper.make_node("Relu" if reader == "SequenceAt" or i else "Identity", [f"c{i}"], [f"y{i}"]))
        outputs.append(f"y{i}")
    return inferred_model(nodes, [vinfo("x", shape=list(shape))], outputs, inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 17])
def test_split_to_sequence_with_lengths_becomes_split(tmp_path, opset):
    out = optimize(tmp_path, sequence_split([0, 2, 1], split=[4, 4, 4], opset=opset), [PASS])
    assert out.ops == ["Split", "Relu", "Relu", "Relu"]
    split = out.node("Split")
    assert [v.name for v in split.outputs] == ["c0", "c2", "c1"] and split.attr("axis") == 1


def test_scalar_chunk_size_with_a_shorter_last_chunk_and_negative_positions(tmp_path):
    out = optimize(tmp_path, sequence_split([-1, 0], split=5), [PASS])
    split = out.node("Split")
    assert out.ops == ["Split", "Relu", "Relu"]
    assert list(split.input(1).constant_value()) == [5, 5, 2]
    assert split.outputs[0].name == "c1" and split.outputs[2].name == "c0" and not split.outputs[1].is_used


def test_no_split_gives_chunks_of_one(tmp_path):
    out = optimize(tmp_path, sequence_split([3], shape=(2, 4)), [PASS])
    assert out.ops == ["Split", "Relu"] and list(out.node("Split").input(1).constant_value()) == [1, 1, 1, 1]


def test_no_split_without_keepdims_is_refused(tmp_path):
    # valid=False: the sequence that stays has no tensor type for the harness's every-value-typed check
    out = optimize(tmp_path, sequence_split([0], shape=(2, 4), keepdims=0), [PASS], valid=False)
    assert out.ops[0] == "SplitToSequence"
    assert out.refused("it has no split and keepdims=0, so its chunks lose the axis a Split keeps")


def test_a_sequence_read_otherwise_is_refused(tmp_path):
    out = optimize(tmp_path, sequence_split([0, 1], split=[6, 6], reader="SequenceLength"), [PASS], valid=False)
    assert out.ops[0] == "SplitToSequence" and out.refused("not only by SequenceAt at constant positions")


def unbound(*, perm=(3, 1, 2, 0, 4), index_shape=(), extra_reader=False, length=4, batch=2, embed=8):
    """torch's nn.MultiheadAttention unbinding its packed in-projection (``_in_projection_packed``):
    p:[L, N, 3E] -> Reshape [L, N, 3, E] -> Unsqueeze 0 -> Transpose(0, -2) -> Squeeze -2 -> Gather 0, 1, 2,
    each part read by a MatMul as q, k and v are."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "zero"], ["u"]),
             helper.make_node("Transpose", ["u"], ["t"], perm=list(perm)),
             helper.make_node("Squeeze", ["t", "squeezed"], ["s"])]
    inits = [tensor("w", np.random.default_rng(1).standard_normal((embed, 3 * embed)).astype(np.float32)),
             tensor("shape", np.array([length, batch, 3, embed], np.int64)), tensor("zero", np.array([0], np.int64)),
             tensor("squeezed", np.array([3], np.int64)), tensor("v", np.ones((embed, embed), np.float32))]
    outputs = []
    for i in range(3):
        inits.append(tensor(f"i{i}", np.array(i, np.int64).reshape(index_shape)))
        nodes += [helper.make_node("Gather", ["s", f"i{i}"], [f"g{i}"], axis=0),
                  helper.make_node("MatMul", [f"g{i}", "v"], [f"y{i}"])]
        outputs.append(f"y{i}")
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["s"], ["also"]))
        outputs.append("also")
    return inferred_model(nodes, [vinfo("x", shape=[length, batch, embed])], outputs, inits)


def test_an_unbound_packed_projection_becomes_one_split_of_the_projection(tmp_path):
    out = optimize(tmp_path, unbound(), [PASS])
    assert out.ops == ["MatMul", "Split", "MatMul", "MatMul", "MatMul"]
    split = out.node("Split")
    assert split.input(0).name == "p" and split.attr("axis") == 2
    assert list(split.input(1).constant_value()) == [8, 8, 8]
    assert [v.name for v in split.outputs] == ["g0", "g1", "g2"]


def test_parts_that_keep_a_unit_dim_get_a_reshape(tmp_path):
    """Gather with a one-element index keeps the axis: each part of the Split is reshaped to [1, L, N, E]."""
    out = optimize(tmp_path, unbound(index_shape=(1,)), [PASS])
    assert out.ops.count("Split") == 1 and out.ops.count("Reshape") == 3 and "Gather" not in out.ops


def test_a_view_that_moves_elements_within_a_part_is_refused(tmp_path):
    """Transpose swapping L and N: each part is [N, L, E] of a [L, N, E] block, not a block in its order."""
    out = optimize(tmp_path, unbound(perm=(3, 2, 1, 0, 4)), [PASS])
    assert "Split" not in out.ops and out.ops.count("Gather") == 3
    assert out.refused("moves elements") or out.refused("are not blocks of consecutive elements")


def test_a_view_read_by_another_node_stays(tmp_path):
    out = optimize(tmp_path, unbound(extra_reader=True), [PASS])
    assert "Split" not in out.ops and out.ops.count("Gather") == 3
