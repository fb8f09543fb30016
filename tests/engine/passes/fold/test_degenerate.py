"""Constant folding and type inference on empty tensors, 0-d scalars, NaN, integer extremes and huge shapes:
each model optimizes through the whole default pipeline, and what comes out computes what onnxruntime
computes for the input (verification on), or the run stops with a sentence. Never an internal error."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import parser

from tests.conftest import run_onnxruntime
from worker.engine.api import optimize
from worker.engine.limits import LimitError, Limits
from worker.engine.options import OptimizeOptions


def optimized(tmp_path, text: str, **options):
    """Optimize the model written as onnx.parser text; returns (report, output model, its op types)."""
    model = parser.parse_model(text)
    onnx.checker.check_model(model)
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    report = optimize(source, target, OptimizeOptions(**options))
    out = onnx.load(target)
    return report, out, [n.op_type for n in out.graph.node]


def produced(model: onnx.ModelProto) -> set[str]:
    """Names of the values some node of the main graph computes (a folded one became an initializer)."""
    return {name for node in model.graph.node for name in node.output}


def refusals(report, pass_name: str) -> dict:
    found: dict = {}
    for entry in report["trace"]:
        if entry["pass"] == pass_name:
            for reason, count in entry.get("refusals", {}).items():
                found[reason] = found.get(reason, 0) + count
    return found


HEAD = '<ir_version: 8, opset_import: ["" : 18]>'


def test_a_cast_of_an_empty_constant_folds(tmp_path):
    """torchvision detection exports: Cast of an int64 [0] constant, concatenated with the boxes."""
    report, out, ops = optimized(tmp_path, HEAD + '''
        g (float[N] x) => (float[M] y) <int64[0] e = {}> {
            c = Cast <to = 1> (e)
            y = Concat <axis = 0> (x, c)
        }''', input_shapes={"x": [3]})
    assert "Cast" not in ops and report["verification"]["passed"]


@pytest.mark.parametrize("op", ["Add", "Mul", "Where", "Max"])
def test_an_elementwise_op_on_an_empty_constant_folds(tmp_path, op):
    inputs = "cond, e, e" if op == "Where" else "e, one"
    report, out, ops = optimized(tmp_path, HEAD + f'''
        g (float[2, 3] x) => (float[2, 3] y) <float[0, 3] e = {{}}, float[1, 3] one = {{1., 2., 3.}},
                                            bool[1] cond = {{1}}> {{
            t = {op} ({inputs})
            r = ReduceSum <keepdims = 1> (t)
            y = Add (x, r)
        }}''')
    assert produced(out) == {"y"} and report["verification"]["passed"]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"])
def test_a_reduction_over_an_empty_set_folds_to_the_runtimes_value_or_stays(tmp_path, op):
    report, out, ops = optimized(tmp_path, HEAD + f'''
        g (float[2, 1] x) => (float[2, 1] y) <float[2, 0] e = {{}}, int64[1] axis = {{1}}> {{
            r = {op} <keepdims = 1> (e, axis)
            y = Add (x, r)
        }}''')
    assert report["verification"]["passed"]


def test_a_reduction_of_nan_folds_to_the_runtimes_value(tmp_path):
    """onnxruntime's ReduceMax skips NaN where numpy propagates it."""
    report, out, ops = optimized(tmp_path, HEAD + '''
        g (float[1] x) => (float[1] y) <float[3] c = {1., 0., 3.}> {
            n = Div (c, c)
            r = ReduceMax <keepdims = 1> (n)
            y = Add (x, r)
        }''')
    assert report["verification"]["passed"] and "ReduceMax" not in ops


def test_a_scalar_folded_by_onnxruntime_stays_a_scalar(tmp_path):
    """A 0-d constant through an op numpy has no kernel for (Erf): the runtime's answer is 0-d too."""
    report, out, ops = optimized(tmp_path, HEAD + '''
        g (float x) => (float y) <float c = {0.5}> {
            e = Erf (c)
            y = Add (x, e)
        }''')
    assert ops == ["Add"] and report["verification"]["passed"]
    folded = {t.name: t for t in out.graph.initializer}
    assert list(folded["e"].dims) == []


def test_integer_division_by_zero_stays_for_the_runtime(tmp_path):
    report, out, ops = optimized(tmp_path, HEAD + '''
        g (int64[2] x) => (int64[2] y) <int64[2] a = {7, 3}, int64[2] b = {0, 1}> {
            q = Div (a, b)
            y = Add (x, q)
        }''', allow_unverified=True)
    assert "Div" in ops
    assert report["verification"]["passed"] is None  # onnxruntime cannot run the input either
    assert any("could not be evaluated" in r for r in refusals(report, "constant_folding"))


def test_the_most_negative_integer_divided_by_minus_one_does_not_kill_the_optimizer(tmp_path):
    """onnxruntime dies of SIGFPE on INT64_MIN / -1: folding must not hand it those inputs. The run is in a
    child process, so a regression fails this test instead of killing the test session."""
    text = HEAD + '''
        g (int64[1] x) => (int64[1] y) <int64[1] a = {-9223372036854775808}, int64[1] b = {-1}> {
            q = Div (a, b)
            y = Add (x, q)
        }'''
    model = parser.parse_model(text)
    onnx.save(model, tmp_path / "in.onnx")
    script = ("from worker.engine.api import optimize; from worker.engine.options import OptimizeOptions; "
              f"optimize({str(tmp_path / 'in.onnx')!r}, {str(tmp_path / 'out.onnx')!r}, "
              "OptimizeOptions(verify=False)); print('ok')")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip().endswith("ok"), child.stderr[-2000:]
    assert "Div" in [n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node]


def test_nan_and_infinite_constants_fold_as_the_runtime_computes_them(tmp_path):
    report, out, ops = optimized(tmp_path, HEAD + '''
        g (float[4] x) => (float[4] y) <float[4] c = {0., 1., -1., 2.}> {
            z = Div (c, c)
            i = Reciprocal (c)
            s = Sqrt (c)
            l = Log (c)
            m = Max (z, i)
            n = Min (m, s)
            p = Add (n, l)
            y = Mul (x, p)
        }''')
    assert ops == ["Mul"] and report["verification"]["passed"]
    reference = run_onnxruntime(tmp_path / "in.onnx", {"x": np.ones(4, np.float32)})[0]
    folded = run_onnxruntime(tmp_path / "out.onnx", {"x": np.ones(4, np.float32)})[0]
    np.testing.assert_array_equal(folded, reference)


@pytest.mark.parametrize("generator, body", [
    ("ConstantOfShape", "t = ConstantOfShape (big)"),
    ("Tile", "t = Tile (one, wrap)"),
    ("Expand", "t = Expand (one, big)"),
    ("Range", "t = Range (zero, huge, step)"),
])
def test_huge_but_bounded_shapes_are_refused_quickly(tmp_path, generator, body):
    """Tensors of 2**62 elements, or whose element count wraps around int64 to 0, are refused by the tensor
    limit before anything computes them; with the limit raised past them they are still never computed (their
    shapes are: Shape of one folds without it)."""
    text = HEAD + f'''
        g (float[1] x) => (float[1] y) <int64[2] big = {{4611686018427387904, 1}},
                                       int64[2] wrap = {{4294967296, 4294967296}}, float[1, 1] one = {{1.}},
                                       int64 zero = {{0}}, int64 huge = {{4611686018427387904}},
                                       int64 step = {{1}}> {{
            {body}
            m = ReduceMax <keepdims = 0> (t)
            f = Cast <to = 1> (m)
            y = Add (x, f)
        }}'''
    started = time.perf_counter()
    with pytest.raises(LimitError, match=f"node '{generator.lower()}' .{generator}. would create a tensor of .* elements, above the "
                                         f"limit of 268,435,456 .limit max_tensor_elements"):
        optimized(tmp_path, text, verify=False)
    assert time.perf_counter() - started < 30
    started = time.perf_counter()
    report, out, ops = optimized(tmp_path, text, verify=False,
                                 limits=Limits(max_tensor_elements=2**70, max_tensor_mb=2**60))
    assert generator in ops and time.perf_counter() - started < 30
