"""A pass whose result does not verify is turned off, as a pass that fails is: the run goes on without it and
warns (--strict fails it). Shown with a plugin pass that nudges a weight (a rewrite verification must catch)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.plugins.conftest import load_path, write_plugin
from worker.engine.api import optimize
from worker.engine.errors import VerificationError
from worker.engine.options import OptimizeOptions

NUDGE = """
    import numpy as np
    from worker.engine.plugins import PassResult, register_pass, register_pipeline

    @register_pass(name="nudge", kind="program", description="scales the weight w by 1.01: a wrong rewrite")
    def nudge(ctx):
        w = ctx.graph.initializers["w"]
        w.const = np.asarray(w.constant_value()) * np.float32(1.01)
        result = PassResult()
        result.rewrote({"rule": "nudge", "from": ["w"], "to": ["w"]})
        return result

    register_pipeline(name="nudged", description="type inference, the nudge, folding",
                      steps=["type_inference", "nudge", "constant_folding"])
"""


@pytest.fixture
def model_path(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    proto = make_model(nodes, [vinfo("x", shape=[2, 4])], [vinfo("y", shape=[2, 3])],
                       [tensor("w", np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))])
    onnx.save(proto, tmp_path / "in.onnx")
    return tmp_path / "in.onnx"


def test_the_pass_that_breaks_verification_is_turned_off_and_the_output_verifies(tmp_path, monkeypatch, model_path):
    load_path(monkeypatch, write_plugin(tmp_path / "plugins", "nudge.py", NUDGE))
    report = optimize(model_path, tmp_path / "out.onnx", OptimizeOptions(pipeline="nudged", strict=False))
    assert report["verification"]["passed"] is True and report["verification"]["outputs"][0]["max_abs_diff"] == 0
    fallback = report["rewrite_fallback"]
    assert fallback["passes"] == ["nudge"] and "does not compute what the input computed" in fallback["failure"]
    assert fallback["runs"] == len(fallback["steps"]) >= 2
    (warning,) = [w for w in report["warnings"] if w["kind"] == "rewrite_fallback"]
    assert warning["message"].startswith("nudge turned off: with it the output did not verify")
    out = onnx.load(tmp_path / "out.onnx")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(out.graph.initializer[0]),
                                  np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))


def test_strict_fails_the_run_instead(tmp_path, monkeypatch, model_path):
    load_path(monkeypatch, write_plugin(tmp_path / "plugins", "nudge.py", NUDGE))
    with pytest.raises(VerificationError, match="does not compute what the input computed"):
        optimize(model_path, tmp_path / "out.onnx", OptimizeOptions(pipeline="nudged", strict=True))
    assert not (tmp_path / "out.onnx").exists()
