"""Every fused op, at the opsets where its body changes: the pass fuses the standard ops exporters write, and
the result runs on onnxruntime (CPU) and onnx.reference with the original's results and is typed by onnx."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.mirserve_fuse.helpers import assert_same_results, assert_typed_by_onnx, op_counts, run_passes
from worker.engine.mirserve_domain.activations import ACTIVATIONS

RNG = np.random.default_rng(7)


def weights(*shape):
    return (RNG.standard_normal(shape) * 0.5).astype(np.float32)


#: base -> (input shape, nodes computing "y" from "x", initializers, pass, output shape)
BASES = {
    "Conv": ([1, 3, 8, 8], [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
             lambda: [tensor("w", weights(4, 3, 3, 3)), tensor("b", weights(4))], "conv_activation_fuse", [1, 4, 8, 8]),
    "ConvTranspose": ([1, 3, 5, 5], [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])],
                      lambda: [tensor("w", weights(3, 4, 3, 3)), tensor("b", weights(4))], "conv_activation_fuse",
                      [1, 4, 11, 11]),
    "Gemm": ([2, 5], [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5)],
             lambda: [tensor("w", weights(4, 5)), tensor("c", weights(4))], "gemm_activation_fuse", [2, 4]),
    "MatMul": ([2, 3, 5], [helper.make_node("MatMul", ["x", "w"], ["y"])],
               lambda: [tensor("w", weights(5, 4))], "gemm_activation_fuse", [2, 3, 4]),
    "Add": ([2, 3, 4], [helper.make_node("Add", ["x", "w"], ["y"])],
            lambda: [tensor("w", weights(4))], "elementwise_activation_fuse", [2, 3, 4]),
}


def scalar(name, value):
    return tensor(name, np.array(value, dtype=np.float32))


def activation(kind: str, opset: int):
    """Nodes computing "z" from "y" the way exporters write ``kind`` at ``opset``, and their constants."""
    make = helper.make_node
    if kind in ("Relu", "Sigmoid", "Tanh") or (kind == "HardSwish" and opset >= 14) or \
            (kind == "Gelu" and opset >= 20):
        return [make(kind, ["y"], ["z"])], []
    if kind == "LeakyRelu":
        return [make(kind, ["y"], ["z"], alpha=0.1)], []
    if kind == "HardSigmoid":
        return [make(kind, ["y"], ["z"], alpha=0.3, beta=0.4)], []
    if kind == "Relu6":
        if opset < 11:
            return [make("Clip", ["y"], ["z"], min=0.0, max=6.0)], []
        return [make("Clip", ["y", "lo", "hi"], ["z"])], [scalar("lo", 0.0), scalar("hi", 6.0)]
    if kind == "Silu":
        return [make("Sigmoid", ["y"], ["s"]), make("Mul", ["y", "s"], ["z"])], []
    if kind == "Swish":  # CLIP's quick_gelu: y * Sigmoid(1.702 * y)
        return [make("Mul", ["y", "k"], ["a"]), make("Sigmoid", ["a"], ["s"]), make("Mul", ["y", "s"], ["z"])], \
            [scalar("k", 1.702)]
    if kind == "HardSwish":  # paddle2onnx: y * Clip(y + 3, 0, 6) / 6
        clip = make("Clip", ["a"], ["clipped"], min=0.0, max=6.0) if opset < 11 \
            else make("Clip", ["a", "lo", "hi"], ["clipped"])
        return [make("Add", ["y", "three"], ["a"]), clip, make("Mul", ["y", "clipped"], ["m"]),
                make("Div", ["m", "six"], ["z"])], \
            [scalar("three", 3.0), scalar("six", 6.0)] + ([scalar("lo", 0.0), scalar("hi", 6.0)] if opset >= 11 else [])
    assert kind == "Gelu"  # torch.onnx: y * (0.5 * (Erf(y / sqrt(2)) + 1))
    return [make("Div", ["y", "sqrt2"], ["d"]), make("Erf", ["d"], ["e"]), make("Add", ["e", "one"], ["u"]),
            make("Mul", ["half", "u"], ["h"]), make("Mul", ["y", "h"], ["z"])], \
        [scalar("sqrt2", math.sqrt(2.0)), scalar("one", 1.0), scalar("half", 0.5)]


def case(base: str, kind: str, opset: int):
    shape, base_nodes, base_inits, pass_name, out_shape = BASES[base]
    act_nodes, act_inits = activation(kind, opset)
    nodes = base_nodes + act_nodes + [helper.make_node("Identity", ["z"], ["out"])]
    model = make_model(nodes, [vinfo("x", shape=shape)], [vinfo("out", shape=out_shape)], base_inits() + act_inits,
                       opset=opset)
    feeds = {"x": (RNG.standard_normal(shape) * 3).astype(np.float32)}
    return model, feeds, pass_name


OPSETS = (9, 11, 13, 17, 20)  # where the bodies change: Clip inputs, Constant value_float, HardSwish, CastLike, Gelu


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("kind", list(ACTIVATIONS))
@pytest.mark.parametrize("base", list(BASES))
def test_fused_op_runs_on_both_runtimes_and_is_typed(tmp_path, base, kind, opset):
    model, feeds, pass_name = case(base, kind, opset)
    output, trace = run_passes(model, tmp_path, [pass_name])
    counts = op_counts(output)
    assert counts == {f"mirserve.Fused{base}{kind}": 1, "Identity": 1}, trace[-1].get("refusals")
    assert_same_results(tmp_path / "in.onnx", output, feeds)
    assert_typed_by_onnx(output)


@pytest.mark.parametrize("base", list(BASES))
def test_an_exported_gelu_that_the_domain_fusion_took_first_still_fuses_into_the_op_before_it(tmp_path, base):
    """Below opset 20 the default pipeline turns torch's erf chain into mirserve.Gelu (transformer_domain_fuse)
    before the activation fusions run: they take mirserve.Gelu as the Gelu it is (ConvNeXt- and FastViT-style
    exports at opset 17 kept Conv + mirserve.Gelu as two nodes)."""
    model, feeds, pass_name = case(base, "Gelu", 17)
    output, trace = run_passes(model, tmp_path, ["transformer_domain_fuse", pass_name])
    assert op_counts(output) == {f"mirserve.Fused{base}Gelu": 1, "Identity": 1}, trace[-1].get("refusals")
    assert_same_results(tmp_path / "in.onnx", output, feeds)
    assert_typed_by_onnx(output)
