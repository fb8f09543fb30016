"""worker/engine/runtime.py: the one way the engine opens an onnxruntime session."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from worker.engine.runtime import cpu_session, session_options

ENGINE = Path(__file__).resolve().parents[2] / "worker"


def test_every_session_of_the_engine_is_opened_by_runtime():
    opened_elsewhere = sorted(str(path.relative_to(ENGINE)) for path in ENGINE.rglob("*.py")
                              if path.name != "runtime.py"
                              and re.search(r"\b(InferenceSession|SessionOptions)\(", path.read_text()))
    assert not opened_elsewhere, f"sessions opened outside worker/engine/runtime.py: {opened_elsewhere}"


def test_sessions_run_the_model_as_written_without_spinning_threads():
    import onnxruntime as ort

    options = session_options()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for pool in ("intra_op", "inter_op"):
        assert options.get_session_config_entry(f"session.{pool}.allow_spinning") == "0"
        assert session_options(spinning=True).get_session_config_entry(f"session.{pool}.allow_spinning") == "1"
    assert session_options(threads=1).intra_op_num_threads == 1
    assert session_options(arena=False).enable_cpu_mem_arena is False

    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]) for name in ("x", "y"))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feed = np.array([[-1.0, 0.5, 2.0], [3.0, -0.25, 0.0]], np.float32)
    [out] = cpu_session(model.SerializeToString()).run(None, {"x": feed})
    np.testing.assert_array_equal(out, np.maximum(feed, 0))
