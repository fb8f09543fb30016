"""Inputs that steer a model get the values its comparisons name, so verification runs each branch."""
from __future__ import annotations

import onnx
import pytest
from onnx import parser

from worker.engine.api import optimize
from worker.engine.errors import VerificationError
from worker.engine.ir import load_model
from worker.engine.numeric import verify
from worker.engine.options import OptimizeOptions
from worker.engine.sample_values import describe, steering_values

HEAD = '<ir_version: 8, opset_import: ["" : 18]>'

#: A voice-activity detector's shape: the 16 kHz sub-network when sr == 16000, else the 8 kHz one, which
#: checks sr == 8000 in turn (the comparison sits in the else branch, on the outer scope's sr).
VAD = '''
    g (float[1, 8] x, int64 sr) => (float[1, 8] y) {
        f = Cast <to = 1> (sr)
        k16 = Constant <value = float {16000}> ()
        is16 = Equal (f, k16)
        y = If (is16) <
            then_branch = t () => (float[1, 8] a) { a = Relu (x) },
            else_branch = e () => (float[1, 8] b) {
                k8 = Constant <value = int64 {8000}> ()
                is8 = Equal (sr, k8)
                b = If (is8) <
                    then_branch = t8 () => (float[1, 8] c) { c = Sigmoid (x) },
                    else_branch = e8 () => (float[1, 8] d) { d = Neg (x) }
                >
            }
        >
    }'''


def model(tmp_path, text: str, name: str = "in.onnx"):
    proto = parser.parse_model(HEAD + text)
    onnx.checker.check_model(proto)
    onnx.save(proto, tmp_path / name)
    return tmp_path / name


def test_an_integer_takes_every_constant_it_is_compared_with_then_a_draw(tmp_path):
    graph = load_model(model(tmp_path, VAD)).graph
    assert steering_values(graph) == {"sr": [8000, 16000, None]}


def test_a_boolean_that_decides_an_if_takes_both_values_and_other_inputs_take_none(tmp_path):
    path = model(tmp_path, '''
        g (float[1, 8] x, bool flag, int64[2] pair, float scale, int64 k) => (float[1, 8] y, bool z) {
            on = Not (flag)
            y = If (on) <
                then_branch = t () => (float[1, 8] a) { a = Relu (x) },
                else_branch = e () => (float[1, 8] b) { b = Neg (x) }
            >
            two = Constant <value = int64[2] {1, 2}> ()
            z0 = Equal (pair, two)
            z1 = ReduceMin <keepdims = 0> (z0)
            half = Constant <value = float {0.5}> ()
            kf = Cast <to = 1> (k)
            z2 = Less (kf, half)
            z3 = Greater (scale, half)
            z4 = And (z1, z2)
            z = And (z4, z3)
        }''')
    # a pair of ints is not a scalar, a float is no integer, 0.5 is no integer an int could equal
    assert steering_values(load_model(path).graph) == {"flag": [True, False]}


def test_verification_runs_the_branch_a_draw_never_takes(tmp_path):
    """A candidate wrong only in the 16 kHz branch: a draw of sr (0 to 99) never runs it; the steering
    values do, and the mismatch is found on the run at sr=16000."""
    reference = model(tmp_path, VAD)
    wrong = model(tmp_path, VAD.replace("a = Relu (x)", "a = Exp (x)"), "wrong.onnx")
    assert verify(str(reference), str(wrong))["passed"] is True  # what a draw alone proves
    values = steering_values(load_model(reference).graph)
    with pytest.raises(VerificationError, match="on run 1 at input shapes x=1x8, sr=scalar with sr=16000,"):
        verify(str(reference), str(wrong), values=values)


def test_the_report_and_the_summary_say_which_values_ran(tmp_path):
    report = optimize(model(tmp_path, VAD), tmp_path / "out.onnx", OptimizeOptions())
    verification = report["verification"]
    assert verification["passed"] is True and verification["runs"] == 3
    assert verification["values"] == {"sr": [8000, 16000, None]}
    assert describe(verification["values"]) == "sr 8000 / 16000 / drawn"
    assert report["summary"]["verification"]["values"] == {"sr": [8000, 16000, None]}


def test_a_constant_the_input_cannot_hold_is_not_one_of_its_values(tmp_path):
    """A uint8 input cast to float and compared with 16000.0 and 7.0: no uint8 is 16000 (np.full would overflow)."""
    path = model(tmp_path, '''
        g (float[1, 8] x, uint8 level) => (float[1, 8] y) {
            f = Cast <to = 1> (level)
            k = Constant <value = float {16000}> ()
            k2 = Constant <value = float {7}> ()
            high = Equal (f, k)
            seven = Equal (f, k2)
            both = Or (high, seven)
            y = If (both) <
                then_branch = t () => (float[1, 8] a) { a = Relu (x) },
                else_branch = e () => (float[1, 8] b) { b = Neg (x) }
            >
        }''')
    assert steering_values(load_model(path).graph) == {"level": [7, None]}
    assert optimize(path, tmp_path / "out.onnx", OptimizeOptions())["verification"]["passed"] is True


def test_the_shapes_are_chosen_with_the_steering_values(tmp_path):
    """A VAD whose other branch runs on no window verification tries: the shapes are chosen on the branch the
    steering value takes (a draw of sr took the other branch and every shape failed)."""
    from worker.engine.numeric import choose_shapes

    path = model(tmp_path, '''
        g (float[1, T] audio, int64 sr) => (float[A, B] y) <int64[2] sevens = {7, -1}> {
            k = Constant <value = int64 {16000}> ()
            is16 = Equal (sr, k)
            y = If (is16) <
                then_branch = t () => (float[A1, B1] a) { a = Identity (audio) },
                else_branch = e () => (float[A2, B2] b) { b = Reshape (audio, sevens) }
            >
        }''')
    values = steering_values(load_model(path).graph)
    assert values == {"sr": [16000, None]}
    assert choose_shapes(str(path), values=values)["shapes"] == [{"audio": [1, 512], "sr": []}]
    with pytest.raises(VerificationError, match="runs on none of the input shapes tried"):
        choose_shapes(str(path))
