"""reduction_global_pool_replace: spatial ReduceMean/ReduceMax -> global pooling (+ Flatten without keepdims)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import optimize
from worker.engine.passes import FixedPoint

PASS = "reduction_global_pool_replace"
ARM = "arm/fp16/nhwc,arm/fp32/nchw"


def reduce(op, x, out, axes, opset, keepdims=1, name=None):
    name = name or out
    if opset >= 18:
        return [helper.make_node(op, [x, f"{name}_axes"], [out], keepdims=keepdims, name=name)], \
               [tensor(f"{name}_axes", np.array(axes, np.int64))]
    return [helper.make_node(op, [x], [out], axes=axes, keepdims=keepdims, name=name)], []


def model(steps, opset=13, x_shape=(1, 3, 5, 4)):
    nodes, inits, last = [], [], "x"
    for i, (op, axes, keep) in enumerate(steps):
        out = "y" if i == len(steps) - 1 else f"r{i}"
        n, t = reduce(op, last, out, axes, opset, keep)
        nodes += n
        inits += t
        last = out
    return inferred_model(nodes, [vinfo("x", shape=list(x_shape))], ["y"], inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("op,pool", [("ReduceMean", "GlobalAveragePool"), ("ReduceMax", "GlobalMaxPool")])
def test_one_reduction_over_h_and_w(tmp_path, opset, op, pool):
    out = optimize(tmp_path, model([(op, [2, -1], 1)], opset), [PASS])
    assert out.ops == [pool] and not out.model.graph.initializers


@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("order", [([2], [3]), ([3], [2])])
def test_mean_over_h_then_w(tmp_path, opset, order):
    out = optimize(tmp_path, model([("ReduceMean", order[0], 1), ("ReduceMean", order[1], 1)], opset), [PASS])
    assert out.ops == ["GlobalAveragePool"]


def test_three_d_spatial(tmp_path):
    out = optimize(tmp_path, model([("ReduceMean", [2, 3, 4], 1)], x_shape=(1, 2, 3, 3, 3)), [PASS])
    assert out.ops == ["GlobalAveragePool"]


@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("x_shape", [(1, 3, 5, 4), (2, 6, 1, 7)])
def test_keepdims_zero_pools_then_flattens_only_where_the_flatten_keeps_a_listed_place(tmp_path, opset, x_shape):
    """ReduceMean(keepdims=0) over the spatial dims is global pooling whose 1x1 dims a Flatten drops (ncnn's
    global pooling writes the flat [N, C] itself), made only where pooling gets a better place and the Flatten
    no worse one than the reduction's. ARM pools in fp16 NHWC and reduces in fp32 NCHW only, but runs views
    on Paddle-Lite's host kernels: the Flatten would be one more host node (mnasnet0_5 and efficientformerv2
    had one more at level 2 than at level 1), so the reduction stays; the harness compares the outputs."""
    axes = list(range(2, len(x_shape)))
    out = optimize(tmp_path, model([("ReduceMean", axes, 0)], opset, x_shape=x_shape), [PASS], places=ARM)
    assert out.ops == ["ReduceMean"] and out.refused("would run on host/")
    with_flatten = "arm/fp16/nhwc,x86/fp32/nchw"  # a listed x86 runs the Flatten: pooling on ARM is worth it
    out = optimize(tmp_path, model([("ReduceMean", axes, 0)], opset, x_shape=x_shape), [PASS], places=with_flatten)
    assert out.ops == ["GlobalAveragePool", "Flatten"]
    flatten = out.node("Flatten")
    assert flatten.attr("axis") == 1 and flatten.output().shape == tuple(x_shape[:2])
    # x86 reduces as well as it pools: the form with one node more gains nothing
    out = optimize(tmp_path, model([("ReduceMean", axes, 0)], opset, x_shape=x_shape), [PASS])
    assert out.ops == ["ReduceMean"] and out.refused("nothing to gain")


@pytest.mark.parametrize("places", [ARM, "x86/fp32/nchw", "opencl/fp16/nchw,arm/fp32/nchw", "cuda/fp32/nchw"])
@pytest.mark.parametrize("source", ["reduction", "pooling"])
def test_the_rewrite_and_its_inverse_settle_on_one_form(tmp_path, places, source):
    """eliminate_flatten_after_global_pooling turns pooling + Flatten back into the reduction: each refuses
    where the other applies, so in one fixed point they settle (they once undid each other until the group's
    cap, renaming the node each time), on the form whose first node has the better place, or as it was."""
    if source == "reduction":
        proto = model([("ReduceMean", [2, 3], 0)], 13, x_shape=(1, 8, 6, 6))
    else:
        proto = inferred_model([helper.make_node("GlobalAveragePool", ["x"], ["p"], name="pool"),
                                helper.make_node("Flatten", ["p"], ["y"], axis=1, name="flatten")],
                               [vinfo("x", shape=[1, 8, 6, 6])], ["y"], opset=13)
    group = FixedPoint("group", (PASS, "eliminate_flatten_after_global_pooling"))
    out = optimize(tmp_path, proto, [group], places=places)
    [fixed_point] = [e for e in out.trace if e["kind"] == "fixed_point"]
    assert fixed_point["converged"] and fixed_point["iterations"] <= 2, fixed_point
    # ARM keeps the form it was given: the pooling has the better place, the reduction the Flatten's
    assert out.ops == (["GlobalAveragePool", "Flatten"] if places == ARM and source == "pooling" else ["ReduceMean"])


def test_keepdims_zero_between_two_reductions_and_partial_axes_are_refused(tmp_path):
    out = optimize(tmp_path, model([("ReduceMean", [2], 1), ("ReduceMean", [2], 0)]), [PASS])
    assert out.ops == ["ReduceMean", "ReduceMean"] and out.refused("(keepdims=0) between two reductions")
    out = optimize(tmp_path, model([("ReduceMean", [1, 2, 3], 1)]), [PASS])
    assert out.ops == ["ReduceMean"] and out.refused("average dims [1, 2, 3], not exactly the spatial dims")


@pytest.mark.parametrize("x_shape", [(1, 0, 7), (1, 3, 0, 4)])
def test_an_empty_input_keeps_its_reduction(tmp_path, x_shape):
    """onnxruntime's global pooling fails on an empty tensor where ReduceMean runs (found by bench/fuzz.py)."""
    axes = list(range(2, len(x_shape)))
    out = optimize(tmp_path, model([("ReduceMean", axes, 1)], x_shape=x_shape), [PASS], valid=False, check=False)
    assert out.ops == ["ReduceMean"] and out.refused("is empty")
