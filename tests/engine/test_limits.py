"""Bombs cost nothing: every limit of ``worker.engine.limits`` refuses its bomb before the work, naming the node
and the limit, within seconds and a small memory footprint; the command line raises a limit with --limit."""
from __future__ import annotations

import time

import onnx
import pytest

from worker.engine.api import OptimizeOptions, optimize
from worker.engine.cli import main
from worker.engine.errors import OptionsError, VerificationError
from worker.engine.limits import LimitError, Limits

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def model_file(tmp_path, text: str, name: str = "bomb.onnx"):
    path = tmp_path / name
    onnx.save(onnx.parser.parse_model(HEADER + text), str(path))
    return path


def refused(tmp_path, path, limits: Limits = Limits(), **options) -> str:
    """The refusal of ``optimize`` for the model at ``path``: it must come quickly and hold little memory."""
    started, resident = time.monotonic(), _peak_reset()
    with pytest.raises((LimitError, VerificationError)) as caught:
        optimize(path, tmp_path / "out.onnx", OptimizeOptions(limits=limits, **options))
    assert time.monotonic() - started < 60
    assert _memory_kib("VmHWM") - resident < 300_000  # KiB: no tensor was made
    assert not (tmp_path / "out.onnx").exists()
    return str(caught.value)


def _memory_kib(field: str) -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))


def _peak_reset() -> int:
    """Set this process's peak resident set (VmHWM) to what is resident now, and return that, in KiB.

    Not ``ru_maxrss``: that is the peak of the whole pytest process, which earlier tests raise (to 600 MB in
    the whole suite), so a growth under that old peak would not show in it."""
    with open("/proc/self/clear_refs", "w") as reset:
        reset.write("5")
    return _memory_kib("VmRSS")


FILL = """g (float[1,16384] x) => (float[1,16384] y) {
  sh = Constant<value = int64[2] {16384, 16384}>()
  w = ConstantOfShape<value = float[1] {0.5}>(sh)
  y = MatMul(x, w)
}"""


def test_a_184_byte_fill_of_1_gib_is_refused_naming_node_and_limit(tmp_path):
    path = model_file(tmp_path, FILL)
    assert path.stat().st_size < 200
    message = refused(tmp_path, path)
    assert message == ("node 'constantofshape' (ConstantOfShape) would create a tensor of 1 GiB, above the limit "
                       "of 512 MiB (limit max_tensor_mb; raise it with --limit max_tensor_mb=N)")


def test_a_raised_tensor_limit_still_keeps_the_fill_out_of_the_artifact_and_verification_in_budget(tmp_path):
    """With the tensor limit raised, folding stays within the output limit (the fill is not folded) and the
    verification child runs out of its memory budget, which the error names."""
    path = model_file(tmp_path, FILL)
    message = refused(tmp_path, path, Limits(max_tensor_mb=2048, verify_memory_mb=1200))
    assert "needed more memory than its budget of 1200 MiB (limit verify_memory_mb" in message


def test_range_of_1e10_elements_is_refused_before_onnx_inference(tmp_path):
    path = model_file(tmp_path, """g (float[1] x) => (float[1] y) {
  s = Constant<value = int64 {0}>()
  l = Constant<value = int64 {10000000000}>()
  d = Constant<value = int64 {1}>()
  r = Range(s, l, d)
  sh = Shape(r)
  m = ReduceMax<keepdims=0>(r)
  f = Cast<to=1>(m)
  y = Add(x, f)
}""")
    assert "node 'range' (Range) would create a tensor of 10,000,000,000 elements, above the limit of " \
           "268,435,456 (limit max_tensor_elements" in refused(tmp_path, path)


LOOP = """g (float[1] x) => (float[1] y) {{
  m = Constant<value = int64 {{4611686018427387904}}>()
  c = Constant<value = bool {{1}}>()
  y = Loop(m, c, x) <body = b (int64 i, bool ci, float[1] a) => (bool co, float[1] an) {{
      {condition}
      an = Add(a, a)
  }}>
}}"""


def test_a_loop_of_2_to_the_62_trips_is_refused_at_once(tmp_path):
    path = model_file(tmp_path, LOOP.format(condition="co = Identity(ci)"))
    assert path.stat().st_size < 400
    assert refused(tmp_path, path) == (
        "node 'loop' (Loop) runs 4,611,686,018,427,387,904 iterations (only its trip count ends it), above the "
        "limit of 1,048,576 (limit max_loop_trips; raise it with --limit max_loop_trips=N)")


def test_a_loop_whose_condition_never_turns_false_ends_with_the_verification_budget(tmp_path):
    path = model_file(tmp_path, LOOP.format(condition="z = Constant<value = int64 {-1}>()\n      co = Greater(i, z)"))
    started = time.monotonic()
    message = refused(tmp_path, path, Limits(verify_seconds=1))  # the least budget: the loop runs forever
    assert time.monotonic() - started < 30
    assert message == ("numeric verification did not finish within its budget of 1 s (limit verify_seconds; "
                       "raise it with --limit verify_seconds=N)")


@pytest.mark.parametrize("body, node", [
    ("""  sh = Constant<value = int64[3] {100000, 100000, 100}>()
  e = Expand(x, sh)
  y = ReduceSum<keepdims=0>(e)""", "node 'expand' (Expand)"),
    ("""  r = Constant<value = int64[1] {1000000000}>()
  t = Tile(x, r)
  y = ReduceSum<keepdims=0>(t)""", "node 'tile' (Tile)"),
    ("""  p = Constant<value = int64[2] {0, 2000000000}>()
  q = Pad(x, p)
  y = ReduceSum<keepdims=0>(q)""", "node 'pad' (Pad)"),
])
def test_expand_tile_and_pad_beyond_the_tensor_limit_are_refused(tmp_path, body, node):
    path = model_file(tmp_path, "g (float[1] x) => (float y) {\n" + body + "\n}")
    message = refused(tmp_path, path)
    assert message.startswith(node + " would create a tensor of") and "(limit max_tensor_" in message


def test_resize_by_huge_scales_is_refused(tmp_path):
    path = model_file(tmp_path, """g (float[1,1,2,2] x) => (float y) {
  s = Constant<value = float[4] {1.0, 1.0, 100000.0, 100000.0}>()
  r = Resize<mode="nearest">(x, , s)
  y = ReduceSum<keepdims=0>(r)
}""")
    assert refused(tmp_path, path).startswith("node 'resize' (Resize) would create a tensor of")


def nested_ifs(depth: int) -> onnx.ModelProto:
    """``depth`` Ifs, each in the then-branch of the one above (the else-branches are one Identity)."""
    def leaf(name: str) -> onnx.GraphProto:
        return onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], [name])], name, [],
                                      [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1])])

    graph = leaf("y0")
    for level in range(1, depth + 1):
        node = onnx.helper.make_node("If", ["c"], [f"y{level}"], then_branch=graph, else_branch=leaf(f"e{level}"))
        graph = onnx.helper.make_graph([node], f"b{level}", [],
                                       [onnx.helper.make_tensor_value_info(f"y{level}", onnx.TensorProto.FLOAT, [1])])
    graph.input.extend([onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1]),
                        onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_nesting_nodes_and_values_beyond_their_limits_are_refused_at_load(tmp_path):
    path = tmp_path / "deep.onnx"
    onnx.save(nested_ifs(6), str(path))
    assert "subgraphs nested deeper than 4 levels (limit max_depth" in refused(tmp_path, path, Limits(max_depth=4))
    onnx.save(nested_ifs(3), str(path))
    assert "more than 5 values (limit max_values" in refused(tmp_path, path, Limits(max_values=5))
    assert "more than 2 nodes (limit max_nodes" in refused(tmp_path, path, Limits(max_nodes=2))


def test_the_output_limit_is_the_larger_of_its_floor_and_a_multiple_of_the_input():
    limits = Limits()
    assert limits.output_limit(1000) == 64 << 20 and limits.output_limit(100 << 20) == 400 << 20
    limits.check_output(64 << 20, 1000)
    with pytest.raises(LimitError, match=r"would hold 65 MiB of weights, above the output limit of 64 MiB "
                                         r"\(the larger of 64 MiB and 4 x the input's 1000 bytes; limit max_output_mb"):
        limits.check_output((64 << 20) + (1 << 20), 1000)


def test_limits_are_not_options_a_request_can_set():
    with pytest.raises(OptionsError, match="unknown option 'limits'"):
        OptimizeOptions.from_dict({"limits": {"max_tensor_mb": 1 << 20}})
    assert "limits" not in OptimizeOptions().to_dict()
    with pytest.raises(OptionsError, match="limit max_nodes must be a number of at least 1"):
        Limits(max_nodes=0)


def test_the_cli_applies_the_limits_and_raises_one_with_a_flag(tmp_path, capsys):
    path = model_file(tmp_path, LOOP.format(condition="co = Identity(ci)").replace("4611686018427387904", "3000"))
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(path), "-o", str(out), "--quiet", "--limit", "max_loop_trips=100"]) == 1
    assert "runs 3,000 iterations (only its trip count ends it), above the limit of 100" in capsys.readouterr().err
    assert main(["optimize", str(path), "-o", str(out), "--quiet", "--limit", "max_loop_trips=5000"]) == 0
    assert out.exists()
    assert main(["optimize", str(path), "-o", str(out), "--limit", "max_bananas=1"]) == 1
    assert "bad limit 'max_bananas=1': expected NAME=VALUE with NAME one of max_nodes" in capsys.readouterr().err
