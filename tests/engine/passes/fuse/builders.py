"""Small model builders shared by the fusion tests."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fuse.harness import floats

C_IN, C_OUT, SIDE = 4, 8, 6


def conv_weight(op: str = "Conv", group: int = 1, c_in: int = C_IN, c_out: int = C_OUT, k: int = 3, seed=1):
    if op == "Conv":
        return floats(c_out, c_in // group, k, k, seed=seed)
    return floats(c_in, c_out // group, k, k, seed=seed)


def conv_then(after: str, constant, *, op: str = "Conv", group: int = 1, bias: bool = True,
              constant_first: bool = False, constant_node: bool = False, outputs=("y",), opset: int = 17,
              weight_input: bool = False, out_shape=None):
    """x -> conv (3x3, pad 1) -> ``after``(conv, constant) -> y."""
    inits = [] if weight_input else [tensor("w", conv_weight(op, group))]
    if bias:
        inits.append(tensor("b", floats(C_OUT, seed=2)))
    nodes = []
    if constant_node:
        nodes.append(helper.make_node("Constant", [], ["k"], value=tensor("k", constant), name="const"))
    else:
        inits.append(tensor("k", constant))
    conv_inputs = ["x", "w"] + (["b"] if bias else [])
    nodes.append(helper.make_node(op, conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1], group=group))
    nodes.append(helper.make_node(after, ["k", "c"] if constant_first else ["c", "k"], ["y"], name="after"))
    inputs = [vinfo("x", shape=[1, C_IN, SIDE, SIDE])]
    if weight_input:
        inputs.append(vinfo("w", shape=list(conv_weight(op, group).shape)))
    conv_shape = [1, C_OUT, SIDE, SIDE]
    shapes = {"c": conv_shape, "y": out_shape or conv_shape}
    return make_model(nodes, inputs, [vinfo(n, shape=shapes[n]) for n in outputs], inits, opset=opset)


def per_channel(*shape, seed=3, low=0.5, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def inferred_model(nodes, inputs, outputs, initializers=(), opset: int = 17):
    """Like conftest.make_model, with the output types (names in ``outputs``) found by onnx shape inference."""
    import onnx

    graph = helper.make_graph(nodes, "test", inputs, [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for output in model.graph.output:
        output.type.CopyFrom(types[output.name])
    onnx.checker.check_model(model)
    return model
