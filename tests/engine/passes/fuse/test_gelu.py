"""gelu_fuse: Erf and Tanh spellings of Gelu in every product order become Gelu at opset 20+."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from tests.conftest import tensor, vinfo
from tests.engine.passes.fuse.builders import inferred_model
from tests.engine.passes.fuse.harness import optimize

PASS = "gelu_fuse"


def tail(order):
    first, second = {"x_a_half": (["x", "a"], ["m", "half"]), "a_half_x": (["half", "a"], ["x", "m"]),
                     "x_half_a": (["x", "half"], ["a", "m"])}[order]
    return [helper.make_node("Mul", first, ["m"]), helper.make_node("Mul", second, ["y"])]


def erf_chain(order="a_half_x", *, opset=20, scaling="Div", root=None):
    root = root if root is not None else (math.sqrt(2) if scaling == "Div" else 1 / math.sqrt(2))
    nodes = [helper.make_node(scaling, ["x", "root"], ["h"]), helper.make_node("Erf", ["h"], ["e"], name="erf"),
             helper.make_node("Add", ["one", "e"], ["a"]), *tail(order)]
    inits = [tensor("root", np.float32(root)), tensor("one", np.float32(1)), tensor("half", np.float32(0.5))]
    return inferred_model(nodes, [vinfo("x", shape=[2, 16])], ["y"], inits, opset=opset)


def tanh_chain(order):
    nodes = [helper.make_node("Pow", ["x", "three"], ["x3"]), helper.make_node("Mul", ["c", "x3"], ["cx3"]),
             helper.make_node("Add", ["x", "cx3"], ["s"]), helper.make_node("Mul", ["s", "k"], ["inner"]),
             helper.make_node("Tanh", ["inner"], ["t"]), helper.make_node("Add", ["t", "one"], ["a"]), *tail(order)]
    inits = [tensor("three", np.float32(3)), tensor("c", np.float32(0.044715)),
             tensor("k", np.float32(math.sqrt(2 / math.pi))), tensor("one", np.float32(1)),
             tensor("half", np.float32(0.5))]
    return inferred_model(nodes, [vinfo("x", shape=[2, 16])], ["y"], inits, opset=20)


@pytest.mark.parametrize("order", ["x_a_half", "a_half_x", "x_half_a"])
@pytest.mark.parametrize("scaling", ["Div", "Mul"])
def test_erf_chain_becomes_gelu(tmp_path, order, scaling):
    out = optimize(tmp_path, erf_chain(order, scaling=scaling), [PASS])
    assert out.ops == ["Gelu"] and not out.model.graph.initializers


@pytest.mark.parametrize("order", ["x_a_half", "x_half_a"])
def test_tanh_chain_becomes_approximate_gelu(tmp_path, order):
    out = optimize(tmp_path, tanh_chain(order), [PASS])
    assert out.ops == ["Gelu"] and out.node("Gelu").attr("approximate") in ("tanh", b"tanh")


def test_opset_18_is_refused(tmp_path):
    out = optimize(tmp_path, erf_chain(opset=18), [PASS])
    assert len(out.ops) == 5 and out.refused("Gelu needs opset 20, and the model imports opset 18")


def test_wrong_constant_is_refused(tmp_path):
    out = optimize(tmp_path, erf_chain(root=1.5), [PASS])
    assert len(out.ops) == 5 and out.refused("so the chain is not Gelu")
