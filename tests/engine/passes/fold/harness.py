"""Run passes on a small onnx.helper model and check the result: IR verified after every pass, every value
typed, the written model valid, and its outputs equal to the input model's on onnxruntime."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx

from tests.conftest import random_feeds, run_onnxruntime
from worker.engine.ir import Model, load_model, save_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.limits import Limits
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.places import parse_places


@dataclass
class Outcome:
    model: Model
    trace: list[dict]
    before: Path
    after: Path
    entries: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def ops(self) -> list[str]:
        return [node.op_type for node in self.model.graph]

    def rewrites(self, pass_name: str) -> int:
        return sum(e["rewrites"] for e in self.entries.get(pass_name, []))

    def refusals(self, pass_name: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for entry in self.entries.get(pass_name, []):
            for reason, count in entry.get("refusals", {}).items():
                found[reason] = found.get(reason, 0) + count
        return found

    def refused(self, pass_name: str, fragment: str) -> bool:
        return any(fragment in reason for reason in self.refusals(pass_name))

    def details(self, pass_name: str) -> list:
        return [d for e in self.entries.get(pass_name, []) for d in e.get("details", [])]

    def saved(self) -> onnx.ModelProto:
        return onnx.load(str(self.after))


def assert_typed(model: Model) -> None:
    """Every value a node reads or writes has an element type and a shape (new values included)."""
    for graph in model.graph.all_graphs():
        for node in graph:
            for value in list(node.inputs) + list(node.outputs):
                if value is None or not value.is_used or value.type_proto is not None:
                    continue
                assert value.dtype and value.shape is not None, f"{value!r} ({node!r}) has no full type"


def run(proto: onnx.ModelProto, steps: Sequence, tmp_path: Path, *, shapes: dict | None = None,
        check: bool = True, rtol: float = 1e-4, atol: float = 1e-5, feeds: dict | None = None,
        typed: bool = True, limits: Limits = Limits()) -> Outcome:
    """type_inference, then ``steps``, through the manager with the IR verified after every pass."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    before, after = tmp_path / "before.onnx", tmp_path / "after.onnx"
    onnx.save(proto, str(before))
    model = load_model(before)
    apply_input_shapes(model.graph, shapes or {})
    ctx = PassContext(model, OptimizeOptions(limits=limits), parse_places(), input_bytes=before.stat().st_size)
    trace = PassManager(instruments=[VerifyInstrument()]).run(ctx, ["type_inference", *steps])
    if typed:  # False only for a model whose input cannot be fully typed
        assert_typed(model)
    save_model(model, after)
    onnx.checker.check_model(onnx.load(str(after)), full_check=True)
    outcome = Outcome(model, trace, before, after)
    for entry in trace:
        outcome.entries.setdefault(entry["pass"], []).append(entry)
    if check:
        compare(before, after, shapes, rtol, atol, feeds)
    return outcome


def compare(before: Path, after: Path, shapes: dict | None = None, rtol: float = 1e-4, atol: float = 1e-5,
            feeds: dict | None = None) -> None:
    feeds = feeds if feeds is not None else random_feeds(before, shapes)
    feeds = {name: np.asarray(array) for name, array in feeds.items()}  # a scalar bool comes back as np.bool_
    expected = run_onnxruntime(before, feeds)
    wanted = {i.name for i in onnx.load(str(after), load_external_data=False).graph.input}
    actual = run_onnxruntime(after, {k: v for k, v in feeds.items() if k in wanted})
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape and e.dtype == a.dtype
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


def if_model(then_nodes, then_out: str, else_nodes, else_out: str, *, x_shape=(2, 3), opset: int = 17,
             initializers=(), then_initializers=(), out_shape=None):
    """y = If(c, then, else) over a float input x of ``x_shape``; bodies may read x and ``initializers``."""
    from onnx import TensorProto, helper

    from tests.conftest import make_model, vinfo

    out_shape = list(x_shape) if out_shape is None else out_shape
    then_graph = helper.make_graph(then_nodes, "then", [], [vinfo(then_out, shape=None)],
                                   list(then_initializers))
    else_graph = helper.make_graph(else_nodes, "else", [], [vinfo(else_out, shape=None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)
    return make_model([node], [vinfo("c", TensorProto.BOOL, []), vinfo("x", shape=list(x_shape))],
                      [vinfo("y", shape=out_shape)], initializers, opset=opset)


def body_of(outcome: Outcome, branch: str = "then_branch"):
    return outcome.model.graph.nodes_of_type("If")[0].attr(branch)


def both_conditions(proto, steps, tmp_path: Path):
    """Run and compare with the condition true and false (If bodies must stay right on both sides)."""
    shapes = None
    outcome = run(proto, steps, tmp_path, check=False)
    for flag in (True, False):
        feeds = random_feeds(outcome.before, shapes)
        feeds["c"] = np.array(flag)
        compare(outcome.before, outcome.after, shapes, feeds=feeds)
    return outcome
