"""fuse_consecutive_slices: a Slice of a Slice over other axes is one Slice; one axis sliced twice stays."""
import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_slices"]


def two_slices(first, second, x_shape, out_shape, shared_shape=None):
    """Relu -> Slice(first) -> Slice(second) -> Neg, each (starts, ends, axes, steps or None) (dynamo's TinyViT
    crops each padded attention window once per spatial axis)."""
    nodes, inits = [helper.make_node("Relu", ["x"], ["a"])], []
    for name, source, (starts, ends, axes, steps) in (("t", "a", first), ("u", "t", second)):
        args = [f"{name}_{k}" for k in ("starts", "ends", "axes")] + ([f"{name}_steps"] if steps else [])
        inits += [tensor(f"{name}_{k}", np.array(v, np.int64))
                  for k, v in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)) if v]
        nodes.append(helper.make_node("Slice", [source, *args], [name]))
    nodes.append(helper.make_node("Neg", ["u"], ["y"]))
    outputs = [vinfo("y", shape=list(out_shape))]
    if shared_shape:  # the first Slice read by another node too
        nodes.append(helper.make_node("Abs", ["t"], ["z"]))
        outputs.append(vinfo("z", shape=list(shared_shape)))
    return make_model(nodes, [vinfo("x", shape=list(x_shape))], outputs, inits)


def test_slices_over_other_axes_become_one(tmp_path):
    model = two_slices(([0], [8], [1], None), ([1], [-1], [-2], [2]), (1, 10, 10, 4), (1, 8, 4, 4))
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Relu", "Slice", "Neg"]
    assert outcome.model.graph.nodes_of_type("Slice")[0].input(0).name == "a"


def test_an_axis_sliced_twice_or_a_shared_slice_stays(tmp_path):
    model = two_slices(([0], [8], [1], None), ([2], [6], [1], None), (1, 10, 10), (1, 4, 10))
    outcome = run(model, STEP, tmp_path / "same")
    assert outcome.ops == ["Relu", "Slice", "Slice", "Neg"]
    assert outcome.refused("fuse_consecutive_slices", "both Slices slice the same axis")
    model = two_slices(([0], [8], [1], None), ([0], [8], [2], None), (1, 10, 10), (1, 8, 8), (1, 8, 10))
    outcome = run(model, STEP, tmp_path / "shared")
    assert outcome.ops.count("Slice") == 2
