"""The hostile-model corpus of issue 14: files an attacker would upload, each with what must come of it.

``build(directory, secret)`` writes every case into ``directory`` and returns the cases. ``secret`` is the
absolute path of a planted file outside the job directory: the external-data cases name it in every way a
model can (relative, ``..``, absolute, through a link), so that a test can assert that no byte of it appears
in any artifact, report or error. Families:

- ``external``: tensors that keep their bytes in a file (initializers, Constant and ConstantOfShape values,
  sparse initializers, tensors inside bodies and functions), and malformed external-data fields;
- ``bomb``: a few hundred bytes that ask for gigabytes or forever (ConstantOfShape, Range, Expand, Tile, Pad,
  Resize, Loop trip counts and conditions, nesting, functions that call the one before twice);
- ``structure``: invalid graphs (a node reading its own output, cycles, duplicate names, unknown opsets,
  impossible Reshape dims, not a model at all);
- ``tensor``: malformed initializers (payload sizes, data types, dims);
- ``naming``: names with control characters, terminal escapes, non-UTF-8 bytes, path-like or huge names;
- ``metadata``: hostile doc strings, metadata properties, producer fields, functions that call themselves.

Every case expects ``refused`` (a user error whose message says what and where) or ``verified`` (a model
onnxruntime runs, optimized and verified). Run it as a script to write the corpus somewhere:
``python -m tests.hostile.corpus DIR``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
REFUSED, VERIFIED = "refused", "verified"


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    expect: str
    #: A fragment the refusal must contain (what and where), when the case pins one.
    says: str = ""

    def path(self, directory: Path) -> Path:
        return directory / f"{self.name}.onnx"


def _parse(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(HEADER + text)


def _vi(name: str, elem: int = TensorProto.FLOAT, shape=(1,)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17, **kwargs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kwargs)
    model.ir_version = 8
    return model


def _external(name: str, location: str, *, dims=(4,), offset: str | None = None, length: str | None = None,
              data_type: int = TensorProto.FLOAT) -> TensorProto:
    tensor = TensorProto(name=name, data_type=data_type, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    entries = [("location", location)] + ([("offset", offset)] if offset is not None else []) \
        + ([("length", length)] if length is not None else [])
    for key, value in entries:
        tensor.external_data.add(key=key, value=value)
    return tensor


def _add_model(initializer: TensorProto) -> onnx.ModelProto:
    """y = x + w, with ``w`` the given initializer."""
    return _model([helper.make_node("Add", ["x", initializer.name], ["y"])], [_vi("x", shape=(4,))],
                  [_vi("y", shape=(4,))], [initializer])


def _constant_model(value: TensorProto, op: str = "Constant") -> onnx.ModelProto:
    if op == "Constant":
        nodes = [helper.make_node("Constant", [], ["w"], value=value), helper.make_node("Add", ["x", "w"], ["y"])]
    else:
        shape = numpy_helper.from_array(np.array([4], np.int64), "shape")
        nodes = [helper.make_node("Constant", [], ["s"], value=shape),
                 helper.make_node("ConstantOfShape", ["s"], ["w"], value=value),
                 helper.make_node("Add", ["x", "w"], ["y"])]
    return _model(nodes, [_vi("x", shape=(4,))], [_vi("y", shape=(4,))])


def external_cases(secret: Path) -> dict[str, tuple[Callable[[], onnx.ModelProto], str, str]]:
    relative = os.path.relpath(secret, secret.parent.parent)  # e.g. "planted/secret.bin" from above
    ways = {
        "plain_name": secret.name,            # resolved against the working directory by onnx
        "dotdot": f"../{secret.name}",
        "dotdot_deep": "../" * 12 + str(secret).lstrip("/"),
        "absolute": str(secret),
        "above": relative,
        "link": "link.bin",                   # the test plants link.bin -> secret beside the model
    }
    cases: dict[str, tuple[Callable[[], onnx.ModelProto], str, str]] = {}
    for way, location in ways.items():
        cases[f"ext_initializer_{way}"] = (lambda loc=location: _add_model(_external("w", loc)), REFUSED,
                                           "external")
    small = lambda name, loc=secret.name: _external(name, loc, dims=(1,))  # noqa: E731
    cases["ext_constant_value"] = (lambda: _constant_model(_external("value", secret.name)), REFUSED, "external")
    cases["ext_constant_value_absolute"] = (lambda: _constant_model(_external("value", str(secret))), REFUSED,
                                            "external")
    cases["ext_constantofshape_value"] = (lambda: _constant_model(small("value"), "ConstantOfShape"), REFUSED,
                                          "external")

    def sparse() -> onnx.ModelProto:
        values = _external("sv", secret.name, dims=(1,))
        indices = numpy_helper.from_array(np.array([0], np.int64), "si")
        model = _model([helper.make_node("Add", ["x", "sp"], ["y"])], [_vi("x", shape=(4,))], [_vi("y", shape=(4,))])
        model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
        model.graph.sparse_initializer[0].values.name = "sp"
        return model

    cases["ext_sparse_initializer"] = (sparse, REFUSED, "external")

    def in_body() -> onnx.ModelProto:
        body = helper.make_graph([helper.make_node("Constant", [], ["b"], value=_external("value", secret.name)),
                                  helper.make_node("Add", ["x", "b"], ["t"])], "then", [], [_vi("t", shape=(4,))])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e", shape=(4,))])
        return _model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)],
                      [_vi("x", shape=(4,)), _vi("c", TensorProto.BOOL, ())], [_vi("y", shape=(4,))])

    cases["ext_constant_in_if_body"] = (in_body, REFUSED, "external")

    def in_function() -> onnx.ModelProto:
        function = helper.make_function("acme", "Leak", ["a"], ["b"], [
            helper.make_node("Constant", [], ["k"], value=_external("value", secret.name)),
            helper.make_node("Add", ["a", "k"], ["b"])], [helper.make_opsetid("", 17)])
        model = _model([helper.make_node("Leak", ["x"], ["y"], domain="acme")], [_vi("x", shape=(4,))],
                       [_vi("y", shape=(4,))])
        model.opset_import.append(helper.make_opsetid("acme", 1))
        model.functions.append(function)
        return model

    cases["ext_constant_in_function"] = (in_function, REFUSED, "external")
    # malformed fields (the model's own directory is where a CLI user's external data may live; the service
    # refuses every external reference before looking at its fields)
    cases["ext_offset_not_integer"] = (lambda: _add_model(_external("w", "data.bin", offset="12abc")), REFUSED,
                                       "external data")
    cases["ext_offset_negative"] = (lambda: _add_model(_external("w", "data.bin", offset="-8")), REFUSED,
                                    "external data")
    cases["ext_length_beyond_file"] = (lambda: _add_model(_external("w", "data.bin", length="1000000")), REFUSED,
                                       "external data")
    cases["ext_offset_huge"] = (lambda: _add_model(_external("w", "data.bin", offset="99999999999999999999")),
                                REFUSED, "external data")
    cases["ext_location_empty"] = (lambda: _add_model(_external("w", "")), REFUSED, "external data")
    cases["ext_location_directory"] = (lambda: _add_model(_external("w", ".")), REFUSED, "external data")
    cases["ext_location_nul"] = (lambda: _add_model(_external("w", "data.bin\x00.txt")), REFUSED, "external data")
    cases["ext_string_tensor"] = (lambda: _add_model(_external("w", "data.bin", data_type=TensorProto.STRING)),
                                  REFUSED, "external data")
    return cases


def bomb_cases() -> dict[str, tuple[Callable[[], onnx.ModelProto], str, str]]:
    def text(body: str, signature: str = "(float[1] x) => (float y)") -> Callable[[], onnx.ModelProto]:
        return lambda: _parse(f"g {signature} {{\n{body}\n}}")

    loop = """  m = Constant<value = int64 {{{trips}}}>()
  c = Constant<value = bool {{1}}>()
  y = Loop(m, c, x) <body = b (int64 i, bool ci, float[1] a) => (bool co, float[1] an) {{
      {condition}
      an = Add(a, a)
  }}>"""
    loop_sig = "(float[1] x) => (float[1] y)"
    return {
        "bomb_constantofshape_1gib": (text("""  sh = Constant<value = int64[2] {16384, 16384}>()
  w = ConstantOfShape<value = float[1] {0.5}>(sh)
  y = ReduceSum<keepdims=0>(w)"""), REFUSED, "limit max_tensor_mb"),
        "bomb_matmul_weight_1gib": (text("""  sh = Constant<value = int64[2] {16384, 16384}>()
  w = ConstantOfShape<value = float[1] {0.5}>(sh)
  y = MatMul(x, w)""", "(float[1,16384] x) => (float[1,16384] y)"), REFUSED, "limit max_tensor_mb"),
        "bomb_constantofshape_wraps_int64": (text("""  sh = Constant<value = int64[3] {4294967296, 4294967296, 4}>()
  w = ConstantOfShape<value = float[1] {0.5}>(sh)
  y = ReduceSum<keepdims=0>(w)"""), REFUSED, "limit max_tensor"),
        "bomb_constantofshape_negative": (text("""  sh = Constant<value = int64[2] {-4, 4}>()
  w = ConstantOfShape<value = float[1] {0.5}>(sh)
  y = ReduceSum<keepdims=0>(w)"""), REFUSED, ""),
        "bomb_range_1e10": (text("""  s = Constant<value = int64 {0}>()
  l = Constant<value = int64 {10000000000}>()
  d = Constant<value = int64 {1}>()
  r = Range(s, l, d)
  m = ReduceMax<keepdims=0>(r)
  f = Cast<to=1>(m)
  y = Add(x, f)""", "(float x) => (float y)"), REFUSED, "limit max_tensor_elements"),
        "bomb_range_float_infinite": (text("""  s = Constant<value = float {0.0}>()
  l = Constant<value = float {1e38}>()
  d = Constant<value = float {1e-30}>()
  r = Range(s, l, d)
  m = ReduceMax<keepdims=0>(r)
  y = Add(x, m)""", "(float x) => (float y)"), REFUSED, "limit max_tensor_elements"),
        "bomb_expand": (text("""  sh = Constant<value = int64[3] {100000, 100000, 100}>()
  e = Expand(x, sh)
  y = ReduceSum<keepdims=0>(e)"""), REFUSED, "limit max_tensor"),
        "bomb_tile": (text("""  r = Constant<value = int64[1] {1000000000}>()
  t = Tile(x, r)
  y = ReduceSum<keepdims=0>(t)"""), REFUSED, "limit max_tensor"),
        "bomb_pad": (text("""  p = Constant<value = int64[2] {0, 2000000000}>()
  q = Pad(x, p)
  y = ReduceSum<keepdims=0>(q)"""), REFUSED, "limit max_tensor"),
        "bomb_resize": (text("""  s = Constant<value = float[4] {1.0, 1.0, 100000.0, 100000.0}>()
  r = Resize<mode="nearest">(x, , s)
  y = ReduceSum<keepdims=0>(r)""", "(float[1,1,2,2] x) => (float y)"), REFUSED, "limit max_tensor"),
        "bomb_loop_2_62_trips": (text(loop.format(trips=2**62, condition="co = Identity(ci)"), loop_sig), REFUSED,
                                 "limit max_loop_trips"),
        "bomb_loop_condition_never_false": (text(loop.format(
            trips=2**62, condition="z = Constant<value = int64 {-1}>()\n      co = Greater(i, z)"), loop_sig),
            REFUSED, "limit verify_seconds"),
        "bomb_loop_scan_output": (text("""  m = Constant<value = int64 {2000000}>()
  c = Constant<value = bool {1}>()
  y, s = Loop(m, c, x) <body = b (int64 i, bool ci, float[1] a) => (bool co, float[1] an, float[1000] sc) {
      co = Identity(ci)
      an = Identity(a)
      k = Constant<value = int64[1] {1000}>()
      sc = Expand(a, k)
  }>""", "(float[1] x) => (float[1] y, float[2000000,1000] s)"), REFUSED, "limit max_loop_trips"),
        "bomb_nested_if_deep": (_nested_ifs(200), REFUSED, ""),
        "bomb_nested_if_33": (_nested_ifs(33), REFUSED, ""),
        "bomb_function_calls_doubling": (lambda: _doubling_functions(40), REFUSED, "limit max_nodes"),
        "bomb_input_dims_huge": (lambda: _model([helper.make_node("Relu", ["x"], ["y"])],
                                                [_vi("x", shape=(2**31, 2**31))], [_vi("y", shape=(2**31, 2**31))]),
                                 REFUSED, "cannot make input 'x'"),
    }


def _doubling_functions(levels: int) -> onnx.ModelProto:
    """Model-local functions each calling the one before twice: one call in the graph stands for 2^levels
    nodes, which shape inference would expand one by one."""
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("bomb", 1)]
    functions = [helper.make_function("bomb", "f0", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], imports)]
    for k in range(1, levels + 1):
        functions.append(helper.make_function(
            "bomb", f"f{k}", ["a"], ["b"], [helper.make_node(f"f{k - 1}", ["a"], ["t"], domain="bomb"),
                                           helper.make_node(f"f{k - 1}", ["t"], ["b"], domain="bomb")], imports))
    model = _model([helper.make_node(f"f{levels}", ["x"], ["y"], domain="bomb")], [_vi("x")], [_vi("y")])
    model.opset_import.append(helper.make_opsetid("bomb", 1))
    model.functions.extend(functions)
    return model


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _nested_ifs(depth: int) -> bytes:
    """``depth`` Ifs, each in the then-branch of the one above, written by hand: protobuf's Python API caps
    the nesting it parses, and a hostile client need not use it."""
    def leaf(name: str) -> bytes:
        return helper.make_graph([helper.make_node("Identity", ["x"], [name])], name, [], [_vi(name)]) \
            .SerializeToString()

    graph = leaf("y0")
    for level in range(1, depth + 1):
        then = onnx.AttributeProto(name="then_branch", type=onnx.AttributeProto.GRAPH).SerializeToString()
        other = onnx.AttributeProto(name="else_branch", type=onnx.AttributeProto.GRAPH, g=onnx.GraphProto.FromString(
            leaf(f"e{level}"))).SerializeToString()
        node = onnx.NodeProto(op_type="If", input=["c"], output=[f"y{level}"]).SerializeToString() \
            + _field(5, then + _field(6, graph)) + _field(5, other)
        head = onnx.GraphProto(name=f"b{level}", output=[_vi(f"y{level}")])
        if level == depth:
            head.input.extend([_vi("x"), _vi("c", TensorProto.BOOL, ())])
        graph = head.SerializeToString() + _field(1, node)
    model = onnx.ModelProto(ir_version=8, opset_import=[helper.make_opsetid("", 17)])
    return model.SerializeToString() + _field(7, graph)


def structure_cases() -> dict[str, tuple[Callable[[], onnx.ModelProto] | bytes, str, str]]:
    relu = lambda inputs, outputs, name="n": helper.make_node("Relu", inputs, outputs, name=name)  # noqa: E731

    def self_edge() -> onnx.ModelProto:
        return _model([helper.make_node("Add", ["x", "y"], ["y"], name="loop_on_itself")], [_vi("x")], [_vi("y")])

    def cycle() -> onnx.ModelProto:
        return _model([relu(["b"], ["a"], "first"), relu(["a"], ["b"], "second"), relu(["b"], ["y"], "out")],
                      [_vi("x")], [_vi("y")])

    def duplicate_inputs() -> onnx.ModelProto:
        return _model([relu(["x"], ["y"])], [_vi("x"), _vi("x")], [_vi("y")])

    def duplicate_initializers() -> onnx.ModelProto:
        w = numpy_helper.from_array(np.ones(1, np.float32), "w")
        return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")], [w, w])

    def produced_twice() -> onnx.ModelProto:
        return _model([relu(["x"], ["y"], "a"), relu(["x"], ["y"], "b")], [_vi("x")], [_vi("y")])

    def input_also_produced() -> onnx.ModelProto:
        return _model([relu(["x"], ["x"], "a"), relu(["x"], ["y"], "b")], [_vi("x")], [_vi("y")])

    def reshape(shape: list[int]) -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            s = numpy_helper.from_array(np.array(shape, np.int64), "s")
            return _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
                          [_vi("x", shape=(2, 3))], [_vi("y", shape=None)], [s])
        return build

    def opset(version: int, domain: str = "") -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            model = _model([relu(["x"], ["y"])], [_vi("x")], [_vi("y")])
            del model.opset_import[:]
            model.opset_import.append(helper.make_opsetid(domain, version))
            return model
        return build

    def unknown_op() -> onnx.ModelProto:
        return _model([helper.make_node("Frobnicate", ["x"], ["y"], name="what")], [_vi("x")], [_vi("y")])

    def missing_output() -> onnx.ModelProto:
        return _model([relu(["x"], ["y"])], [_vi("x")], [_vi("y"), _vi("nowhere")])

    def reads_nothing() -> onnx.ModelProto:
        return _model([helper.make_node("Add", ["x", "ghost"], ["y"])], [_vi("x")], [_vi("y")])

    def rank0_bool() -> onnx.ModelProto:
        return _model([helper.make_node("Not", ["b"], ["y"])], [_vi("b", TensorProto.BOOL, ())],
                      [_vi("y", TensorProto.BOOL, ())])

    def no_graph() -> bytes:
        return onnx.ModelProto(ir_version=8).SerializeToString()

    valid = _model([relu(["x"], ["y"])], [_vi("x")], [_vi("y")]).SerializeToString()
    return {
        "struct_self_edge": (self_edge, REFUSED, "loop_on_itself"),
        "struct_cycle": (cycle, REFUSED, "cycle"),
        "struct_duplicate_input_names": (duplicate_inputs, REFUSED, "'x'"),
        "struct_duplicate_initializer_names": (duplicate_initializers, REFUSED, "'w'"),
        "struct_output_produced_twice": (produced_twice, REFUSED, "'y'"),
        "struct_input_also_produced": (input_also_produced, REFUSED, "'x'"),
        "struct_reshape_minus_two": (reshape([-2, 3]), REFUSED, "bad_reshape"),
        "struct_reshape_two_minus_ones": (reshape([-1, -1]), REFUSED, "bad_reshape"),
        "struct_reshape_minus_one_valid": (reshape([-1, 2]), VERIFIED, ""),
        "struct_opset_99": (opset(99), REFUSED, "99"),
        "struct_opset_0": (opset(0), REFUSED, ""),
        "struct_unknown_op": (unknown_op, REFUSED, "Frobnicate"),
        "struct_output_not_produced": (missing_output, REFUSED, "nowhere"),
        "struct_reads_undefined": (reads_nothing, REFUSED, "ghost"),
        "struct_rank0_bool_input": (rank0_bool, VERIFIED, ""),
        "struct_no_graph": (no_graph(), REFUSED, "not an ONNX model"),
        "struct_garbage": (b"\x08\x07\x12\xff\xff\xff\xff\x0fgarbage" * 40, REFUSED, "not an ONNX model"),
        "struct_truncated": (valid[: len(valid) // 2], REFUSED, "not an ONNX model"),
        "struct_empty": (b"", REFUSED, "empty"),  # the service refuses it at upload (422)
    }


def tensor_cases() -> dict[str, tuple[Callable[[], onnx.ModelProto], str, str]]:
    def raw(data: bytes, dims=(4,), data_type=TensorProto.FLOAT) -> Callable[[], onnx.ModelProto]:
        return lambda: _add_model(TensorProto(name="w", data_type=data_type, dims=list(dims), raw_data=data))

    def floats(values, dims=(4,)) -> Callable[[], onnx.ModelProto]:
        return lambda: _add_model(TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims),
                                              float_data=values))

    def constant(tensor: TensorProto) -> Callable[[], onnx.ModelProto]:
        return lambda: _constant_model(tensor)

    big = np.ones(1024, np.float32).tobytes()
    return {
        "tensor_raw_too_short": (raw(b"\x00" * 6), REFUSED, "'w'"),
        "tensor_raw_too_long_mapped": (raw(big + b"\x00" * 4, dims=(1024,)), REFUSED, "'w'"),
        "tensor_float_data_count": (floats([1.0, 2.0]), REFUSED, "'w'"),
        "tensor_undefined_type": (raw(b"\x00" * 16, data_type=0), REFUSED, "'w'"),
        "tensor_unknown_type": (raw(b"\x00" * 16, data_type=99), REFUSED, "'w'"),
        "tensor_negative_dims": (raw(b"", dims=(-4,)), REFUSED, "'w'"),
        "tensor_constant_raw_mismatch": (constant(TensorProto(name="value", data_type=TensorProto.FLOAT, dims=[4],
                                                              raw_data=b"\x00" * 7)), REFUSED, ""),
        "tensor_constant_unknown_type": (constant(TensorProto(name="value", data_type=77, dims=[4],
                                                              raw_data=b"\x00" * 16)), REFUSED, ""),
    }


def _rename(model: onnx.ModelProto, placeholder: bytes, replacement: bytes) -> bytes:
    """The serialized model with a placeholder name replaced by bytes of the same length (non-UTF-8 ones too:
    protobuf's Python API refuses to write them, a hostile client need not)."""
    assert len(placeholder) == len(replacement)
    data = model.SerializeToString()
    assert placeholder in data
    return data.replace(placeholder, replacement)


def naming_cases() -> dict[str, tuple[Callable[[], onnx.ModelProto] | bytes, str, str]]:
    def named(node_name: str = "n", input_name: str = "x", output_name: str = "y") -> Callable[[], onnx.ModelProto]:
        return lambda: _model([helper.make_node("Relu", [input_name], [output_name], name=node_name)],
                              [_vi(input_name)], [_vi(output_name)])

    placeholder = _model([helper.make_node("Relu", ["x"], ["y"], name="PLACEHOLDER_NAME")], [_vi("x")], [_vi("y")])
    placeholder_value = _model([helper.make_node("Relu", ["VALUEHOLDER"], ["y"], name="n")],
                               [_vi("VALUEHOLDER")], [_vi("y")])
    return {
        "name_terminal_escape": (named(node_name="\x1b[2J\x1b[31mowned\x1b[0m"), VERIFIED, ""),
        "name_control_chars": (named(node_name="a\rb\x07c\x08\x00d"), VERIFIED, ""),
        "name_newlines_in_value": (named(input_name="x\nmirserve: error: fake", output_name="y\r\n"), VERIFIED, ""),
        "name_bidi_override": (named(node_name="\u202egnp.exe"), VERIFIED, ""),
        "name_path_like": (named(node_name="../../etc/passwd", input_name="/etc/shadow"), VERIFIED, ""),
        "name_huge": (named(node_name="n" * 200_000), VERIFIED, ""),
        "name_empty_everything": (named(node_name=""), VERIFIED, ""),
        "name_non_utf8_node": (_rename(placeholder, b"PLACEHOLDER_NAME", b"\xff\xfe\x80bad\xc3(name\xed\xa0\x80!"),
                               REFUSED, "UTF-8"),
        "name_non_utf8_value": (_rename(placeholder_value, b"VALUEHOLDER", b"\xc0\xaf\xff\xfe-value\x80"), REFUSED,
                                "UTF-8"),
        "name_duplicate_nodes": (lambda: _model([helper.make_node("Relu", ["x"], ["a"], name="same"),
                                                 helper.make_node("Relu", ["a"], ["y"], name="same")],
                                                [_vi("x")], [_vi("y")]), REFUSED, "cannot be verified"),
    }


def metadata_cases() -> dict[str, tuple[Callable[[], onnx.ModelProto] | bytes, str, str]]:
    def base(**fields) -> onnx.ModelProto:
        model = _model([helper.make_node("Relu", ["x"], ["y"], name="n")], [_vi("x")], [_vi("y")])
        for key, value in fields.items():
            setattr(model, key, value)
        return model

    def props(entries: dict[str, str]) -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            model = base()
            helper.set_model_props(model, entries)
            return model
        return build

    def recursive_function() -> onnx.ModelProto:
        function = helper.make_function("acme", "Again", ["a"], ["b"],
                                        [helper.make_node("Again", ["a"], ["b"], domain="acme")],
                                        [helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
        model = _model([helper.make_node("Again", ["x"], ["y"], domain="acme")], [_vi("x")], [_vi("y")])
        model.opset_import.append(helper.make_opsetid("acme", 1))
        model.functions.append(function)
        return model

    meta_holder = base()
    helper.set_model_props(meta_holder, {"METAKEY": "ok"})
    return {
        "meta_huge_doc_string": (lambda: base(doc_string="d" * 5_000_000), VERIFIED, ""),
        "meta_escape_producer": (lambda: base(producer_name="\x1b]0;owned\x07", producer_version="\x1b[2J"),
                                 VERIFIED, ""),
        "meta_escape_props": (props({"\x1b[31mkey": "\x1b[2Jvalue", "path": "/etc/passwd"}), VERIFIED, ""),
        "meta_many_props": (props({f"k{i}": "v" * 100 for i in range(20_000)}), VERIFIED, ""),
        "meta_non_utf8_prop": (_rename(meta_holder, b"METAKEY", b"\xff\xfeKEY\x80\x81"), REFUSED, "UTF-8"),
        "meta_negative_model_version": (lambda: base(model_version=-5), VERIFIED, ""),
        "meta_ir_version_0": (lambda: base(ir_version=0), REFUSED, ""),
        "meta_ir_version_huge": (lambda: base(ir_version=2**40), REFUSED, ""),
        "meta_recursive_function": (recursive_function, REFUSED, "Again"),
    }


def all_cases(secret: Path) -> dict[str, tuple[Case, Callable[[], onnx.ModelProto] | bytes]]:
    found = {}
    for family, cases in (("external", external_cases(secret)), ("bomb", bomb_cases()),
                          ("structure", structure_cases()), ("tensor", tensor_cases()),
                          ("naming", naming_cases()), ("metadata", metadata_cases())):
        for name, (make, expect, says) in cases.items():
            found[name] = (Case(name, family, expect, says), make)
    return found


def build(directory: Path, secret: Path) -> list[Case]:
    """Write every case into ``directory`` (and, beside them, what external-data cases point at)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    link = directory / "link.bin"
    if not link.is_symlink():
        link.symlink_to(secret)
    built = []
    for name, (case, make) in all_cases(secret).items():
        data = make if isinstance(make, bytes) else make().SerializeToString()
        case.path(directory).write_bytes(data)
        built.append(case)
    return built


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "hostile")
    planted = target.parent.resolve() / "planted" / "secret.bin"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"MIRSERVE-PLANTED-SECRET-" + os.urandom(16).hex().encode())
    cases = build(target, planted)
    print(f"{len(cases)} hostile models in {target} (secret planted at {planted})")
