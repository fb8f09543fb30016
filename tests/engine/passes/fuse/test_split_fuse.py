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
