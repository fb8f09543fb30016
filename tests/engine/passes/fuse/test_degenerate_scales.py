"""Folding a scale into weights when the scale is zero, NaN, infinite or would overflow the weights' type:
refused with a sentence where the fused weights would not compute what the Mul or Div computed, and never an
internal error (a Div by an all-zero scale made fold_scale_axis raise ZeroDivisionError)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import parser

from worker.engine.api import optimize
from worker.engine.options import OptimizeOptions
from worker.engine.passes.support.weights import cast_like

HEAD = '<ir_version: 8, opset_import: ["" : 18]>'


def optimized(tmp_path, text: str):
    model = parser.parse_model(HEAD + text)
    onnx.checker.check_model(model)
    onnx.save(model, tmp_path / "in.onnx")
    report = optimize(tmp_path / "in.onnx", tmp_path / "out.onnx", OptimizeOptions())
    return report, [n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node]


def refusals(report) -> list[str]:
    return [reason for entry in report["trace"] if entry["pass"] in ("fold_scale_axis", "conv_scale_fuse")
            for reason in entry.get("refusals", {})]


@pytest.mark.parametrize("scale", ["0.", "-0."])
def test_a_division_by_a_zero_scalar_stays(tmp_path, scale):
    report, ops = optimized(tmp_path, f'''
        g (float[2, 4] x) => (float[2, 3] y) <float[4, 3] w = {{1., 2., 3., 4., 5., 6., 7., 8., 9., 1., 2., 3.}},
                                             float k = {{{scale}}}> {{
            m = MatMul (x, w)
            y = Div (m, k)
        }}''')
    assert "Div" in ops and report["verification"]["passed"]
    assert any("divides by zero" in r for r in refusals(report))


@pytest.mark.parametrize("value, reason", [("1e38", "would overflow float32 weights"),
                                           ("inf", "NaN or infinite")])
def test_a_scale_that_would_overflow_or_is_infinite_stays(tmp_path, value, reason):
    text = '''
        g (float[1, 2, 4, 4] x) => (float[1, 2, 4, 4] y) <float[2, 2, 1, 1] w = {1e3, 2., 3., 4.},
                                                          float[1, 2, 1, 1] s = {VALUE, 2.}> {
            t = Mul (x, s)
            y = Conv (t, w)
        }'''.replace("VALUE", value)
    report, ops = optimized(tmp_path, text)
    assert ops == ["Mul", "Conv"] and report["verification"]["passed"]
    assert any(reason in r for r in refusals(report))


def test_a_nan_scale_after_a_conv_stays(tmp_path):
    report, ops = optimized(tmp_path, '''
        g (float[1, 2, 4, 4] x) => (float[1, 2, 4, 4] y) <float[2, 2, 1, 1] w = {1., 2., 3., 4.},
                                                          float[1, 2, 1, 1] s = {nan, 2.}> {
            c = Conv (x, w)
            y = Mul (c, s)
        }''')
    assert ops == ["Conv", "Mul"] and report["verification"]["passed"]
    assert any("NaN or infinite" in r for r in refusals(report))


def test_an_all_zero_scale_folds_exactly(tmp_path):
    """Multiplying by zero is exact in the weights too (for finite inputs, which verification draws)."""
    report, ops = optimized(tmp_path, '''
        g (float[1, 2, 4, 4] x) => (float[1, 2, 4, 4] y) <float[2, 2, 1, 1] w = {1., 2., 3., 4.},
                                                          float[1, 2, 1, 1] s = {0., 0.}> {
            t = Mul (x, s)
            y = Conv (t, w)
        }''')
    assert ops == ["Conv"] and report["verification"]["passed"]


def test_a_scalar_weight_stays_a_scalar():
    """np.ascontiguousarray makes a 0-d array 1-d: a folded 0-d weight changed its rank."""
    assert cast_like(np.float64(0.5) * np.ones(()), np.ones((), np.float32)).shape == ()
