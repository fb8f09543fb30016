"""fuse_consecutive_concats: a Concat reading Concats along its axis takes their inputs; other axes stay."""
import onnx
import onnx.parser

from tests.engine.passes.fold.harness import run

STEP = ["fuse_consecutive_concats"]


def model(body: str, out: str = "float[1,16,4,4] y") -> onnx.ModelProto:
    return onnx.parser.parse_model(f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,4,4] x) => ({out}) {{
  a = Relu (x)
  b = Sigmoid (x)
  c = Tanh (x)
{body}
}}""")


def concat_inputs(outcome) -> list[list[str]]:
    return [[v.name for v in n.inputs] for n in outcome.model.graph if n.op_type == "Concat"]


def test_inner_concats_along_the_same_axis_are_inlined_in_place(tmp_path):
    """Inception's stage-wise concatenation: both inner Concats, one under a negative axis, in their places."""
    outcome = run(model("""  ab = Concat <axis = 1> (a, b)
  cx = Concat <axis = -3> (c, x)
  y = Concat <axis = 1> (ab, x, cx)"""), STEP, tmp_path)
    assert concat_inputs(outcome) == [["a", "b", "x", "c", "x"]]


def test_an_inner_concat_read_twice_or_read_elsewhere(tmp_path):
    outcome = run(model("""  ab = Concat <axis = 1> (a, b)
  abab = Concat <axis = 1> (ab, ab)
  n = Neg (ab)
  y = Concat <axis = 1> (abab, n)""", "float[1,24,4,4] y"), STEP, tmp_path)
    # the Neg still reads ab; the outer reads abab's inputs, and abab's are ab's
    assert sorted(concat_inputs(outcome)) == [["a", "b"], ["a", "b", "a", "b", "n"]]


def test_another_axis_is_left_alone(tmp_path):
    outcome = run(model("""  ab = Concat <axis = 2> (a, b)
  cc = Concat <axis = 2> (c, c)
  y = Concat <axis = 1> (ab, cc)""", "float[1,8,8,4] y"), STEP, tmp_path)
    assert concat_inputs(outcome) == [["a", "b"], ["c", "c"], ["ab", "cc"]]
