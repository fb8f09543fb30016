"""A rule's pattern is built once per process for its class, name and ``pattern_args``: every rule declares what
its ``build_pattern`` reads, rules that differ there get patterns of their own, and equal ones share one."""
from __future__ import annotations

import ast
import inspect
import textwrap

import worker.engine.passes  # noqa: F401  (imports every built-in pass, and so every built-in rule)
from worker.engine.passes.eliminate.identity_scale_eliminate import IdentityScaleRule
from worker.engine.pattern import Rule


def all_rules() -> list[type[Rule]]:
    found, todo = [], [Rule]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls is not Rule]


def attributes_read(function) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}


def test_every_rule_declares_what_its_pattern_depends_on():
    rules = [cls for cls in all_rules() if cls.build_pattern is not Rule.build_pattern]
    assert len(rules) > 50  # the built-in rules were found
    undeclared = {cls.__qualname__: sorted(read - {"name", *cls.pattern_args})
                  for cls in rules if (read := attributes_read(cls.build_pattern)) - {"name", *cls.pattern_args}}
    assert undeclared == {}, "build_pattern reads attributes missing from pattern_args (the cache would mix them up)"


def test_rules_differing_only_in_pattern_args_get_patterns_of_their_own_and_equal_ones_share_one():
    mul, add = IdentityScaleRule(("Mul",), commutative=True), IdentityScaleRule(("Add",), commutative=True)
    assert mul.name == add.name  # the name alone would not tell them apart
    assert mul.matcher is not add.matcher
    assert [op.types for op in mul.matcher.pattern.ops.values()] == [frozenset({"Mul"})]
    assert [op.types for op in add.matcher.pattern.ops.values()] == [frozenset({"Add"})]
    assert IdentityScaleRule(("Mul",), commutative=True).matcher is mul.matcher
    assert IdentityScaleRule(("Mul",), commutative=False).matcher is not mul.matcher


def test_a_rule_forwarding_a_better_known_value_leaves_the_types_stale_so_its_readers_are_typed_again(tmp_path):
    """Reshape(ids, [-1, 0]) keeps ids' shape; where its output was typed (unk, s), as an earlier inference
    left it, what reads it was typed so too. eliminate_nop_reshape forwards ids (n, s); its readers are then
    typed again (at the end of this run, as before the next pass that needs types), not left with the made-up
    batch."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from tests.conftest import make_model, tensor, vinfo
    from worker.engine.ir import load_model
    from worker.engine.options import OptimizeOptions
    from worker.engine.passes import PassContext, PassManager
    from worker.engine.places import parse_places

    nodes = [helper.make_node("Reshape", ["ids", "target"], ["flat"]),
             helper.make_node("Gather", ["table", "flat"], ["y"], axis=0)]
    model = make_model(nodes, [vinfo("ids", TensorProto.INT64, ["n", "s"])], [vinfo("y", shape=[None, None, None])],
                       [tensor("target", np.array([-1, 0], np.int64)), tensor("table", np.zeros((16, 8), np.float32))])
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    ctx = PassContext(loaded, OptimizeOptions(), parse_places())
    PassManager().run(ctx, ["type_inference"])
    loaded.graph.value("flat").shape = ("unk__7", "s")  # typed worse than it could be, as a stale type is
    loaded.graph.outputs[0].shape = ("unk__7", "s", 8)
    trace = PassManager().run(ctx, ["eliminate_nop_reshape"])
    assert [n.op_type for n in loaded.graph] == ["Gather"]
    assert loaded.graph.outputs[0].shape == ("n", "s", 8)
    assert [entry["pass"] for entry in trace] == ["eliminate_nop_reshape", "type_inference"]


def test_a_forwarded_value_learns_the_dims_its_readers_knew_and_its_other_readers_are_typed_again(tmp_path):
    """Add(h, 0) where h was left typed (unk, unk, 8) by an earlier inference and the sum (b, s, 8):
    identity_scale_eliminate forwards h, which is the sum, so h takes (b, s, 8) and what else reads h is typed
    again from it (the BERT export's residual Adds were refused by add_layer_norm_fuse for want of this)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from tests.conftest import make_model, tensor, vinfo
    from worker.engine.ir import load_model
    from worker.engine.options import OptimizeOptions
    from worker.engine.passes import PassContext, PassManager
    from worker.engine.places import parse_places

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "zero"], ["sum"]),
             helper.make_node("Relu", ["sum"], ["y"]), helper.make_node("Neg", ["h"], ["z"])]
    model = make_model(nodes, [vinfo("x", TensorProto.FLOAT, ["b", "s", 8])],
                       [vinfo("y", shape=[None, None, None]), vinfo("z", shape=[None, None, None])],
                       [tensor("w", np.ones((8, 8), np.float32)), tensor("zero", np.zeros(8, np.float32))])
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    ctx = PassContext(loaded, OptimizeOptions(), parse_places())
    PassManager().run(ctx, ["type_inference"])
    graph = loaded.graph
    graph.value("h").shape = ("unk__1", "unk__2", 8)  # stale, as a pass outside inference can leave it
    graph.value("z").shape = ("unk__1", "unk__2", 8)
    trace = PassManager().run(ctx, ["identity_scale_eliminate"])
    assert [n.op_type for n in graph] == ["MatMul", "Relu", "Neg"]
    assert graph.value("h").shape == ("b", "s", 8)
    assert [entry["pass"] for entry in trace] == ["identity_scale_eliminate", "type_inference"]
    assert graph.value("z").shape == ("b", "s", 8)
