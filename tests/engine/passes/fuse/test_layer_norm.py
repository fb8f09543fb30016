"""layer_norm_fuse: the written-out chain becomes LayerNormalization at opset 17+; refusals."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import floats, optimize

PASS = "layer_norm_fuse"


def reduce_mean(x, out, axes, opset, name):
    if opset >= 18:
        return helper.make_node("ReduceMean", [x, f"{name}_axes"], [out], name=name)
    return helper.make_node("ReduceMean", [x], [out], name=name, axes=axes)


def chain(*, opset=17, square="pow", affine="full", axes=(-1,), var_axes=None, x_shape=(2, 3, 8), eps=True):
    nodes = [reduce_mean("x", "mean", list(axes), opset, "mean_op"),
             helper.make_node("Sub", ["x", "mean"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else
             helper.make_node("Mul", ["d", "d"], ["sq"]),
             reduce_mean("sq", "var", list(var_axes or axes), opset, "var_op"),
             *([helper.make_node("Add", ["var", "eps"], ["ve"])] if eps else []),
             helper.make_node("Sqrt", ["ve" if eps else "var"], ["std"]),
             helper.make_node("Div", ["d", "std"], ["n" if affine != "none" else "y"], name="div")]
    inits = [tensor("eps", np.float32(1e-3))] * eps + ([tensor("two", np.float32(2))] if square == "pow" else [])
    if opset >= 18:
        inits += [tensor("mean_op_axes", np.array(axes, np.int64)),
                  tensor("var_op_axes", np.array(var_axes or axes, np.int64))]
    if affine == "scale":
        nodes.append(helper.make_node("Mul", ["gamma", "n"], ["y"]))
    if affine == "full":
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]), helper.make_node("Add", ["beta", "g"], ["y"])]
    if affine != "none":
        inits += [tensor("gamma", floats(x_shape[-1], seed=3)), tensor("beta", floats(1, x_shape[-1], seed=4))]
    if affine == "scale":
        inits.pop()
    return inferred_model(nodes, [vinfo("x", shape=list(x_shape))], ["y"], inits, opset=opset)


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("affine", ["full", "scale", "none"])
def test_chain_becomes_layer_normalization(tmp_path, opset, square, affine):
    out = optimize(tmp_path, chain(opset=opset, square=square, affine=affine), [PASS])
    assert out.ops == ["LayerNormalization"]
    node = out.node("LayerNormalization")
    assert node.attr("axis") == 2 and node.attr("epsilon") == pytest.approx(1e-3)
    assert len(out.model.graph.initializers) == {"full": 2, "scale": 1, "none": 1}[affine]


@pytest.mark.parametrize("affine", ["full", "none"])
def test_chain_without_epsilon_is_the_op_with_epsilon_0(tmp_path, affine):
    # I-BERT's float layer norm as the dynamo exporter writes it: Sqrt of the variance, no epsilon added
    out = optimize(tmp_path, chain(affine=affine, eps=False), [PASS])
    assert out.ops == ["LayerNormalization"] and out.node("LayerNormalization").attr("epsilon") == 0.0


def test_two_trailing_axes(tmp_path):
    out = optimize(tmp_path, chain(axes=(1, 2), affine="none"), [PASS])
    assert out.ops == ["LayerNormalization"] and out.node("LayerNormalization").attr("axis") == 1


def test_opset_16_is_refused(tmp_path):
    out = optimize(tmp_path, chain(opset=16), [PASS])
    assert len(out.ops) == 9 and out.refused("needs opset 17, and the model imports opset 16")


@pytest.mark.parametrize("axes,var_axes", [((1,), None), ((-1,), (1,))])
def test_axes_that_are_not_a_trailing_block_are_refused(tmp_path, axes, var_axes):
    out = optimize(tmp_path, chain(axes=axes, var_axes=var_axes), [PASS])
    assert len(out.ops) == 9 and out.refused("do not both average a trailing block")
