"""The memory section through the engine's entry point, as the service and the CLI get it."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper

from tests.conftest import make_model, save_proto, tensor
from tests.engine.memory.plan_checker import check_memory_report
from worker.engine.api import optimize
from worker.engine.options import OptimizeOptions


def symbolic_model(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8])],
                       [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4, 8, 8])],
                       [tensor("w", np.ones((4, 3, 1, 1), np.float32))])
    return save_proto(model, tmp_path / "model.onnx")


def test_dim_bounds_from_the_options_reach_the_plan(tmp_path):
    # portable: the Conv -> Relu stays two ops (fused, no intermediate tensor would be left to plan)
    options = OptimizeOptions.from_dict({"dim_bounds": {"N": 3}, "verify": False, "portable": True})
    report = optimize(symbolic_model(tmp_path), tmp_path / "out.onnx", options)
    memory = report["memory"]
    assert check_memory_report(memory) == []
    assert memory["arenas"][0]["lower_bound_bytes"] == 3 * 4 * 64 * 4
    assert report["options"]["dim_bounds"] == {"N": 3}


def test_the_memory_section_is_null_when_the_pipeline_does_not_plan(tmp_path):
    report = optimize(symbolic_model(tmp_path), tmp_path / "out.onnx",
                      OptimizeOptions(pipeline="analysis", verify=False))
    assert report["memory"] is None
