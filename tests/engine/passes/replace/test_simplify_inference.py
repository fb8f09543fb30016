"""simplify_inference: a lone BatchNormalization becomes Mul/Add that the next op folds; refused where it
would add a node."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import conv_weight, inferred_model
from tests.engine.passes.fuse.harness import floats, optimize
from tests.engine.passes.fuse.test_conv_bn import bn_node, bn_tensors

PASS = "simplify_inference"
X = [1, 4, 6, 6]


def bn_then(consumer: str, *, pads=0, stats=None, x_shape=X):
    nodes = [bn_node("x", "n", epsilon=0.05)]
    inits = stats or bn_tensors(x_shape[1])
    if consumer == "Conv":
        nodes.append(helper.make_node("Conv", ["n", "w", "b"], ["y"], name="conv", pads=[pads] * 4))
        inits += [tensor("w", conv_weight()), tensor("b", floats(8, seed=2))]
    elif consumer == "Gemm":
        nodes.append(helper.make_node("Gemm", ["n", "w"], ["y"], name="gemm"))
        inits.append(tensor("w", floats(4, 5)))
    else:
        nodes.append(helper.make_node(consumer, ["n"], ["y"], name="relu"))
    return inferred_model(nodes, [vinfo("x", shape=x_shape)], ["y"], inits)


@pytest.mark.parametrize("pads", [0, 1])
def test_batchnorm_before_a_conv_disappears_into_it(tmp_path, pads):
    out = optimize(tmp_path, bn_then("Conv", pads=pads), [PASS, "fold_scale_axis", "fold_scale_axis"])
    expected = ["Conv"] if pads == 0 else ["Add", "Conv"]
    assert out.ops == expected
    assert out.rewrites(PASS) == 1
    assert out.entry(PASS)["details"][0]["to"] == (["bn_mul", "bn_add"] if pads == 0 else ["bn_add", "bn_mul"])


def test_batchnorm_before_a_gemm(tmp_path):
    out = optimize(tmp_path, bn_then("Gemm", x_shape=[3, 4]), [PASS, "fold_scale_axis", "fold_scale_axis"])
    assert out.ops == ["Gemm"]


def test_batchnorm_before_relu_is_refused(tmp_path):
    out = optimize(tmp_path, bn_then("Relu"), [PASS])
    assert out.ops == ["BatchNormalization", "Relu"]
    assert out.refused("would add a node: its output goes to Relu 'relu', which does not fold both")


def test_pure_scale_becomes_one_mul(tmp_path):
    stats = bn_tensors(4)
    stats[1] = tensor("bn_bias", np.zeros(4, np.float32))
    stats[2] = tensor("bn_mean", np.zeros(4, np.float32))
    out = optimize(tmp_path, bn_then("Relu", stats=stats), [PASS])
    assert out.ops == ["Mul", "Relu"]
    assert out.model.graph.nodes_of_type("Mul")[0].input(1).shape == (4, 1, 1)


def test_statistics_that_are_not_constants_are_refused(tmp_path):
    model = bn_then("Conv")
    model.graph.input.append(vinfo("bn_var", shape=[4]))
    del model.graph.initializer[3]
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["BatchNormalization", "Conv"] and out.refused("(input_var) are not constants")
