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


#: y ^ 3 as exporters write it: torch's Pow, or written out (Gemma's and GPT-J's gelu_new) in either order.
CUBES = {"pow": [helper.make_node("Pow", ["x", "three"], ["x3"])],
         "x_times_square": [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Mul", ["x", "sq"], ["x3"])],
         "square_times_x": [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Mul", ["sq", "x"], ["x3"])]}


def tanh_chain(order, cube="pow", outputs=("y",)):
    nodes = [*CUBES[cube], helper.make_node("Mul", ["c", "x3"], ["cx3"]),
             helper.make_node("Add", ["x", "cx3"], ["s"]), helper.make_node("Mul", ["s", "k"], ["inner"]),
             helper.make_node("Tanh", ["inner"], ["t"]), helper.make_node("Add", ["t", "one"], ["a"]), *tail(order)]
    inits = [tensor("c", np.float32(0.044715)), tensor("k", np.float32(math.sqrt(2 / math.pi))),
             tensor("one", np.float32(1)), tensor("half", np.float32(0.5))]
    inits += [tensor("three", np.float32(3))] if cube == "pow" else []
    return inferred_model(nodes, [vinfo("x", shape=[2, 16])], list(outputs), inits, opset=20)


@pytest.mark.parametrize("order", ["x_a_half", "a_half_x", "x_half_a"])
@pytest.mark.parametrize("scaling", ["Div", "Mul"])
def test_erf_chain_becomes_gelu(tmp_path, order, scaling):
    out = optimize(tmp_path, erf_chain(order, scaling=scaling), [PASS])
    assert out.ops == ["Gelu"] and not out.model.graph.initializers


@pytest.mark.parametrize("cube", sorted(CUBES))
@pytest.mark.parametrize("order", ["x_a_half", "x_half_a"])
def test_tanh_chain_becomes_approximate_gelu(tmp_path, order, cube):
    out = optimize(tmp_path, tanh_chain(order, cube), [PASS])
    assert out.ops == ["Gelu"] and out.node("Gelu").attr("approximate") in ("tanh", b"tanh")
    assert not out.model.graph.initializers


def test_a_cube_whose_square_is_read_elsewhere_stays(tmp_path):
    """x * x is also an output of the model: the chain would have to keep it, so it is left whole."""
    out = optimize(tmp_path, tanh_chain("x_a_half", "x_times_square", outputs=["y", "sq"]), [PASS])
    assert "Gelu" not in out.ops and "Tanh" in out.ops


def factored_chain(inner_one: str = "one"):
    """BLOOM's x * 0.5 * (1 + tanh(0.79788456 * x * (inner_one + 0.044715 * x * x)))."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Mul", ["x", "c"], ["b"]),
             helper.make_node("Mul", ["b", "x"], ["b2"]), helper.make_node("Add", ["b2", inner_one], ["b3"]),
             helper.make_node("Mul", ["a", "b3"], ["inner"]), helper.make_node("Tanh", ["inner"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["p"]), helper.make_node("Mul", ["x", "half"], ["xh"]),
             helper.make_node("Mul", ["xh", "p"], ["y"])]
    inits = [tensor("k", np.float32(0.79788456)), tensor("c", np.float32(0.044715)), tensor("one", np.float32(1)),
             tensor("two", np.float32(2)), tensor("half", np.float32(0.5))]
    return inferred_model(nodes, [vinfo("x", shape=[2, 16])], ["y"], inits, opset=20)


def test_blooms_factored_tanh_chain_with_one_constant_read_twice_becomes_approximate_gelu(tmp_path):
    """BLOOM's form, its one constant 1.0 read by both Adds: the pattern binds that one value to both of its
    constant vars."""
    out = optimize(tmp_path, factored_chain(), [PASS])
    assert out.ops == ["Gelu"] and out.node("Gelu").attr("approximate") in ("tanh", b"tanh")


def test_a_factored_chain_with_another_inner_constant_is_refused(tmp_path):
    out = optimize(tmp_path, factored_chain(inner_one="two"), [PASS])
    assert "Gelu" not in out.ops and out.refused("so the chain is not Gelu")
