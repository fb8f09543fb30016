"""Cast insertion on one-rule models: sharing, offline weight conversion, layouts, copies, outputs."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, save_proto, tensor, vinfo
from tests.engine.passes.place.helpers import _chain as chain
from tests.engine.passes.place.helpers import casts, check_annotations, check_edges, check_shared_casts, place_model
from tests.engine.passes.place.test_corpus import assert_same_outputs
from worker.engine.api import optimize
from worker.engine.ir import load_model, save_model
from worker.engine.options import OptimizeOptions
from worker.engine.passes.support.casts import cast_kind
from worker.engine.places import Precision

RNG = np.random.default_rng(7)


def weights(*shape):
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


def placed(tmp_path, model, places, **options):
    source = save_proto(model, tmp_path / "in.onnx")
    ctx = place_model(source, places, **options)
    check_annotations(ctx.graph)
    check_shared_casts(ctx.graph)
    check_edges(ctx, fp16_storage=options.get("fp16_storage", False))
    out = tmp_path / "out.onnx"
    save_model(ctx.model, out)
    assert_same_outputs(source, out, {}, fp16="fp16" in places or options.get("fp16_storage", False))
    return ctx, out


def two_convs():
    """x feeds two convolutions whose results are added: x has two consumers."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    return make_model(nodes, [vinfo("x", shape=[1, 3, 8, 8])], [vinfo("y", shape=[1, 4, 8, 8])],
                      [tensor("w1", weights(4, 3, 3, 3)), tensor("w2", weights(4, 3, 3, 3))])


def test_one_calib_per_value_shared_by_all_its_consumers(tmp_path):
    ctx, out = placed(tmp_path, two_convs(), "arm/fp16/nchw")
    graph = ctx.graph
    [calib_in] = [n for n in graph.value("x").consumers()]
    assert cast_kind(calib_in) == "calib" and calib_in.attr("to") == TensorProto.FLOAT16
    assert {n.name for n in calib_in.output().consumers()} == {"conv_a", "conv_b"}
    # weights converted offline: fp16 initializers, the fp32 originals gone
    assert {v.name: v.dtype for v in graph.initializers.values()} == {"w1_fp16": TensorProto.FLOAT16,
                                                                      "w2_fp16": TensorProto.FLOAT16}
    # the output leaves as it came in: float, under its own name, through one calib
    stored = onnx.load(str(out))
    assert stored.graph.output[0].name == "y"
    assert stored.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert cast_kind(graph.outputs[0].producer) == "calib"
    assert len(casts(graph)) == 2


def test_nhwc_convolution_reads_transposed_weights_and_layout_casts(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[2, 2, 2, 2], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, [vinfo("x", shape=[1, 3, 8, 8])], [vinfo("y", shape=[1, 8, 8, 8])],
                       [tensor("w", weights(8, 3, 5, 5)), tensor("b", weights(8))])
    # the standard Conv's NHWC form is the subject: keep the Relu apart from it, and give the pick no other
    # place (with arm/fp32/nchw too, four casts would cost more than fp16 saves on so small a conv)
    ctx, out = placed(tmp_path, model, "arm/fp16/nhwc", disabled_passes=("conv_activation_fuse",))
    graph = ctx.graph
    [conv] = graph.nodes_of_type("NhwcConv", "mirserve")
    assert conv.metadata["mirserve.kernel"] == "arm:Conv:1-21:fp16:nhwc"
    weight = conv.input(1)
    assert weight.shape == (8, 5, 5, 3) and weight.dtype == TensorProto.FLOAT16   # OHWI, fp16, in the file
    original = onnx.numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(weight.const.astype(np.float32), np.transpose(original, (0, 2, 3, 1)), atol=1e-3)
    kinds = [cast_kind(n) for n in graph if cast_kind(n)]
    assert sorted(kinds) == ["calib", "calib", "layout", "layout"]  # in: fp32->fp16, nchw->nhwc; out: back
    relu = graph.nodes_of_type("Relu")[0]
    assert relu.metadata["mirserve.place"] == "arm/fp16/nhwc" and relu.output().shape == (1, 8, 8, 8)
    stored = onnx.load(str(out))
    assert {f.name for f in stored.functions} == {"NhwcConv", "calib", "layout"}


def test_lower_rank_constants_are_laid_out_like_the_nhwc_data(tmp_path):
    # the Relu keeps the Add from folding into the conv's bias
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "bias"], ["y"], name="add")]
    model = make_model(nodes, [vinfo("x", shape=[1, 3, 6, 6])], [vinfo("y", shape=[1, 8, 6, 6])],
                       [tensor("w", weights(8, 3, 1, 1)), tensor("bias", weights(8, 1, 1))])
    ctx, _ = placed(tmp_path, model, "arm/fp16/nhwc", disabled_passes=("conv_activation_fuse",))
    add = ctx.graph.nodes_of_type("Add")[0]
    bias = add.input(1)
    assert bias.is_initializer and bias.shape == (1, 1, 1, 8) and bias.dtype == TensorProto.FLOAT16


def erf_between_convs():
    """Convolutions big enough (4M MACs each) that running them on the GPU pays for the copies around it."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv_a"),
             helper.make_node("Erf", ["a"], ["e"], name="erf"),
             helper.make_node("Conv", ["e", "w2"], ["y"], name="conv_b")]
    return make_model(nodes, [vinfo("x", shape=[1, 64, 32, 32])], [vinfo("y", shape=[1, 64, 32, 32])],
                      [tensor("w1", weights(64, 64, 1, 1) / 4), tensor("w2", weights(64, 64, 1, 1) / 4)])


def grid_sample_then_erf():
    """A GridSample (which OpenCL runs in fp16 and CUDA only in fp32; both now run every op of the fused ops'
    bodies, so those no longer tell the two apart) feeding an Erf (which CUDA runs and OpenCL does not)."""
    nodes = [helper.make_node("GridSample", ["x", "grid"], ["s"], name="sample"),
             helper.make_node("Erf", ["s"], ["y"], name="erf")]
    return make_model(nodes, [vinfo("x", shape=[1, 3, 4, 4]), vinfo("grid", shape=[1, 4, 4, 2])],
                      [vinfo("y", shape=[1, 3, 4, 4])])


def _cast_chain(value):
    chain = []
    while value.producer is not None and cast_kind(value.producer):
        chain.append(value.producer)
        value = value.producer.input(0)
    return list(reversed(chain))


def test_io_copy_where_a_value_leaves_or_enters_the_gpu(tmp_path):
    # OpenCL runs no Erf: it runs on a CPU target in the host's memory (ARM in fp32, or the host's reference
    # kernel in fp16 without calibs: the cheaper one)
    ctx, _ = placed(tmp_path, erf_between_convs(), "opencl/fp16/nchw,arm/fp32/nchw")
    graph = ctx.graph
    erf = graph.nodes_of_type("Erf")[0]
    assert erf.metadata["mirserve.place"].split("/")[0] in ("arm", "host")
    assert all(n.metadata["mirserve.place"].startswith("opencl/") for n in graph.nodes_of_type("Conv"))
    into_erf = [(cast_kind(n), n.metadata["mirserve.kernel"]) for n in _cast_chain(erf.input(0))]
    assert into_erf[0] == ("io_copy", "opencl:mirserve.io_copy:1-:any:any:device_to_host")
    conv_b = next(n for n in graph if n.name == "conv_b")
    assert ("io_copy", "opencl:mirserve.io_copy:1-:any:any:host_to_device") in \
        [(cast_kind(n), n.metadata["mirserve.kernel"]) for n in _cast_chain(conv_b.input(0))]
    out_chain = [cast_kind(n) for n in _cast_chain(graph.outputs[0])]
    assert "io_copy" in out_chain and "calib" in out_chain  # back to host memory, in float


def test_a_copy_between_two_devices_goes_through_the_host(tmp_path):
    ctx, _ = placed(tmp_path, grid_sample_then_erf(), "opencl/fp16/nchw,cuda/fp16/nchw", host_fallback=False)
    erf = ctx.graph.nodes_of_type("Erf")[0]
    assert erf.metadata["mirserve.place"] == "cuda/fp16/nchw"
    chain = [n.metadata["mirserve.kernel"] for n in _cast_chain(erf.input(0))]
    assert chain == ["opencl:mirserve.io_copy:1-:any:any:device_to_host",
                     "cuda:mirserve.io_copy:1-:any:any:host_to_device"]


def test_fp16_storage_keeps_weights_half_with_one_calib_each(tmp_path):
    ctx, out = placed(tmp_path, two_convs(), "x86/fp32/nchw", fp16_storage=True)
    stored = onnx.load(str(out))
    assert {t.data_type for t in stored.graph.initializer} == {TensorProto.FLOAT16}
    calibs = [n for n in ctx.graph if cast_kind(n) == "calib"]
    assert len(calibs) == 2 and all(n.input(0).is_initializer for n in calibs)


def test_portable_output_has_standard_ops_only(tmp_path):
    ctx, out = placed(tmp_path, two_convs(), "arm/fp16/nhwc,arm/fp32/nchw", portable=True)
    stored = onnx.load(str(out))
    assert {n.domain for n in stored.graph.node} == {""} and not stored.functions
    # no NHWC form without the own domain: the convolutions run NCHW (so in fp32, the place for NCHW; the
    # Add follows them rather than pay two calibs for an fp16 Add)
    assert all(n.metadata["mirserve.place"].endswith("nchw") for n in ctx.graph.nodes_of_type("Conv"))
    ctx, out = placed(tmp_path, two_convs(), "arm/fp16/nchw", portable=True)
    stored = onnx.load(str(out))
    assert {n.domain for n in stored.graph.node} == {""} and not stored.functions
    kinds = {n.op_type: {p.key: p.value for p in n.metadata_props}.get("mirserve.cast")
             for n in stored.graph.node}
    assert kinds.get("Cast") == "calib"


def fp16_sub_then_float():
    """An fp16 model whose result leaves as float: x - c in fp16, Cast to float, MatMul (fuzz graph 2334)."""
    nodes = [helper.make_node("Sub", ["x", "c"], ["s"], name="sub"),
             helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["f", "w"], ["y"], name="matmul")]
    return make_model(nodes, [vinfo("x", TensorProto.FLOAT16, [1, 1, 2])], [vinfo("y", shape=[1, 1, 3])],
                      [tensor("c", np.array([[[-1.4482422]]], np.float16)), tensor("w", weights(2, 3) * 10)])


def test_fp32_places_widen_an_fp16_model_and_verify_it_at_fp16_tolerances(tmp_path):
    from worker.engine.api import optimize, tolerances
    from worker.engine.options import OptimizeOptions
    from worker.engine.passes.support.casts import widens_fp16
    from worker.engine.places import parse_places

    ctx = place_model(save_proto(fp16_sub_then_float(), tmp_path / "in.onnx"), "x86/fp32/nchw")
    assert widens_fp16(ctx.graph) and ctx.graph.value("s").dtype == TensorProto.FLOAT  # the Sub runs in fp32
    assert not widens_fp16(place_model(save_proto(two_convs(), tmp_path / "fp32.onnx"), "x86/fp32/nchw").graph)
    options, places = OptimizeOptions(places="x86/fp32/nchw"), parse_places("x86/fp32/nchw")
    # the outputs differ by fp16's rounding of the Sub (1e-3 relative), beyond fp32's tolerances
    report = optimize(tmp_path / "in.onnx", tmp_path / "out.onnx", options)
    assert report["verification"]["passed"] and report["verification"]["rtol"] == tolerances(options, places, True)[0]
    assert tolerances(options, places, True) == tolerances(OptimizeOptions(places="arm/fp16/nchw"),
                                                           parse_places("arm/fp16/nchw"))
    assert tolerances(options, places, True) > tolerances(options, places)


def fp16_chain_leaving_fp16():
    """An fp16 model whose fp16 values leave their type: Cast to float, a comparison, a Shape."""
    half = TensorProto.FLOAT16
    nodes = [helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
             helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT, name="widen"),
             helper.make_node("Greater", ["t", "k"], ["above"], name="compare"),
             helper.make_node("Shape", ["t"], ["dims"], name="shape")]
    return make_model(nodes, [vinfo("x", half, [4, 64])],
                      [vinfo("y", shape=[4, 64]), vinfo("above", TensorProto.BOOL, [4, 64]),
                       vinfo("dims", TensorProto.INT64, [2])],
                      [tensor("k", np.array(0.3, np.float16))])


def test_an_fp16_value_computed_in_fp32_is_rounded_where_it_leaves_fp16(tmp_path):
    # no fp16 place: Tanh computes in fp32, but the Cast and the comparison read what the model has, an fp16
    # value (rounded by a calib, and back for an fp32 kernel); Shape reads no values and gets no calib
    import onnxruntime as ort

    source = save_proto(fp16_chain_leaving_fp16(), tmp_path / "in.onnx")
    ctx = place_model(source, "x86/fp32/nchw")
    check_annotations(ctx.graph)
    graph = ctx.graph
    assert graph.value("t").dtype == TensorProto.FLOAT      # widened: Tanh runs on an fp32 kernel

    def read_by(name):
        value = next(n for n in graph if n.name == name).input(0)
        chain = []
        while value.producer is not None and cast_kind(value.producer) == "calib":
            chain.append(value.producer.attr("to"))
            value = value.producer.input(0)
        return value.name, chain[::-1]

    for consumer in ("widen", "compare"):
        source_name, chain = read_by(consumer)
        assert source_name == "t" and chain[0] == TensorProto.FLOAT16, (consumer, chain)
    assert read_by("shape") == ("t", [])
    out = tmp_path / "out.onnx"
    save_model(ctx.model, out)
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float16)
    y, above = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(["y", "above"], {"x": x})
    assert np.array_equal(y.astype(np.float16).astype(np.float32), y)  # the model's y holds fp16 values only
    exact = np.tanh(x.astype(np.float64))
    assert np.abs(y - exact).max() <= 2.0 ** -11                        # fp16's rounding of tanh, no more
    assert np.array_equal(above, y > np.float16(0.3))                   # compared as the Cast sees it


#: Control flow whose variadic values differ in type: each keeps its own (the cast passes used to read one
#: precision for all of them and stop at the first int64 one: "declares fp32 at input 3, but tok is int64").
MIXED_CONTROL_FLOW = {
    "loop": """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,6,6] x, int64 n, int64 tok) => (float[1,4,6,6] y, int64 t2, float[K,1,4,6,6] ys) {
  t = Constant <value = bool {1}> ()
  y, t2, ys = Loop (n, t, x, tok) <
    body = b (int64 i, bool ci, float[1,4,6,6] acc, int64 tk) => (bool co, float[1,4,6,6] acc2, int64 tk2,
                                                                  float[1,4,6,6] out) {
      co = Identity(ci)
      half = Constant <value = float {0.5}> ()
      scaled = Mul(acc, half)
      acc2 = Relu(scaled)
      one = Constant <value = int64 {1}> ()
      tk2 = Add(tk, one)
      out = Sigmoid(acc2)
    }
  >
}""",
    "scan": """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] s0, int64[1] c0, float[5,1,4] xs) => (float[1,4] s, int64[1] c, float[5,1,4] ys) {
  s, c, ys = Scan (s0, c0, xs) <
    num_scan_inputs = 1,
    body = b (float[1,4] st, int64[1] ct, float[1,4] x) => (float[1,4] st2, int64[1] ct2, float[1,4] y) {
      st2 = Add(st, x)
      one = Constant <value = int64[1] {1}> ()
      ct2 = Add(ct, one)
      y = Tanh(st2)
    }
  >
}""",
    "if": """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,6,6] x, bool c) => (float[1,4,6,6] y, int64[4] s) {
  y, s = If (c) <
    then_branch = tb () => (float[1,4,6,6] a, int64[4] sa) { a = Relu(x)  sa = Shape(a) },
    else_branch = eb () => (float[1,4,6,6] b, int64[4] sb) { b = Sigmoid(x)  sb = Shape(b) }
  >
}""",
}


@pytest.mark.parametrize("places", ["x86/fp32/nchw", "arm/fp16/nhwc,arm/fp32/nchw", "cuda/fp16/nchw",
                                    "opencl/fp16/nchw,arm/fp32/nchw"])
@pytest.mark.parametrize("kind", list(MIXED_CONTROL_FLOW))
def test_control_flow_values_of_different_types_each_keep_their_own(kind, places, tmp_path):
    """Placed, annotated, every edge agreeing with its ports, and the same outputs (types included)."""
    placed(tmp_path, onnx.parser.parse_model(MIXED_CONTROL_FLOW[kind]), places)


BRANCHES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,6,6] x, bool c) => (float[1,4,6,6] y) {
  y = If (c) <
    then_branch = tb () => (float[1,4,6,6] a) { a0 = Conv <pads = [1, 1, 1, 1]> (x, w)  a = Relu (a0) },
    else_branch = eb () => (float[1,4,6,6] b) { b = Sigmoid (x) }
  >
}"""


@pytest.mark.parametrize("places, body_target", [("arm/fp16/nhwc,arm/fp32/nchw", "arm"), ("x86/fp32/nchw", "x86"),
                                                 ("opencl/fp16/nchw,arm/fp32/nchw", "arm"),
                                                 ("opencl/fp16/nchw", "host")])
def test_a_body_of_a_control_flow_op_on_the_host_runs_on_a_listed_target_sharing_its_memory(places, body_target,
                                                                                          tmp_path):
    """ARM has no If kernel (Paddle-Lite runs conditional_block on the host): the If runs on the host and its
    branches' Conv, Relu and Sigmoid on ARM, in the model's own fp32 NCHW, as Paddle-Lite picks a sub-block's
    ops; x86 runs If itself; an OpenCL device does not share host memory, so without ARM the body stays on host."""
    model = onnx.parser.parse_model(BRANCHES)
    model.graph.initializer.append(tensor("w", weights(4, 4, 3, 3)))
    ctx, _ = placed(tmp_path, model, places)
    body = [n for graph in ctx.graph.all_graphs() if graph is not ctx.graph for n in graph]
    assert sorted(n.op_type for n in body) == ["FusedConvRelu", "Sigmoid"]
    assert {str(n.place) for n in body} == {f"{body_target}/fp32/nchw"}


def test_slices_fused_into_a_split_stay_on_arm():
    """Paddle-Lite's ARM split kernel (kFloat, kInt64): split_fuse's Split does not send the slices to the host."""
    model = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,8,8,8] x) => (float[1,4,8,8] y) <int64[1] s0 = {0}, int64[1] e0 = {4}, int64[1] s1 = {4},
                                            int64[1] e1 = {8}, int64[1] ax = {1}> {
  a = Slice (x, s0, e0, ax)
  b = Slice (x, s1, e1, ax)
  ra = Relu (a)
  rb = Relu (b)
  y = Add (ra, rb)
}""")
    ctx = place_model(save_proto(model, Path(tempfile.mkdtemp()) / "in.onnx"), "arm/fp16/nhwc,arm/fp32/nchw")
    assert "Split" in {n.op_type for n in ctx.graph}
    assert {str(n.place).split("/")[0] for n in ctx.graph} == {"arm"}


#: Two convolutions that run NHWC (or on a GPU), their result read inside one branch of an If whose condition
#: is computed from the data: verification cannot choose the branch, so each must be right as placed.
READ_IN_BODY = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,8,16,16] x) => (float[1,8,16,16] y) <float two = {2.0}> {
  c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
  r1 = Relu (c1)
  c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)
  r2 = Relu (c2)
  m = ReduceMean <keepdims = 0> (x)
  big = Greater (m, two)
  y = If (big) <
    then_branch = tb () => (float[1,8,16,16] a) { a = Sigmoid (r2) },
    else_branch = eb () => (float[1,8,16,16] b) { b = Neg (x) }
  >
}"""


@pytest.mark.parametrize("places, cast", [("arm/fp32/nhwc", "layout"), ("arm/fp16/nhwc,arm/fp32/nchw", "layout"),
                                          ("opencl/fp16/nchw,arm/fp32/nchw", "io_copy")])
def test_a_value_a_body_reads_is_brought_back_to_the_bodys_layout_and_memory(places, cast, tmp_path):
    """Bodies run in the model's own NCHW and host memory: an NHWC (or device) value they read gets a layout cast
    (or an io_copy) before the If, as a top-level consumer's would. Without it the then branch read the NHWC
    tensor as NCHW: 0.5 off where verification passed (it ran the else branch), or a model onnxruntime refused."""
    import onnxruntime as ort

    model = onnx.parser.parse_model(READ_IN_BODY)
    model.graph.initializer.extend([tensor("w1", weights(8, 8, 3, 3)), tensor("w2", weights(8, 8, 3, 3))])
    source = save_proto(model, tmp_path / "in.onnx")
    ctx = place_model(source, places)
    check_annotations(ctx.graph)
    (sigmoid,) = [n for body in ctx.graph.all_graphs() if body is not ctx.graph for n in body
                  if n.op_type == "Sigmoid"]
    read, kinds = chain(sigmoid.input(0))
    assert read.name == "r2" and cast in kinds, f"the branch reads r2 through {kinds}"
    out = tmp_path / "out.onnx"
    save_model(ctx.model, out)
    reference, candidate = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (source, out))
    tolerance = 5e-2 if "fp16" in places else 1e-5
    for shift in (0.0, 5.0):  # the else branch, then the then branch
        x = {"x": (RNG.random((1, 8, 16, 16)) + shift).astype(np.float32)}
        np.testing.assert_allclose(candidate.run(None, x)[0], reference.run(None, x)[0], atol=tolerance)


LOOP_AFTER_CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,32,32,32] x0, int64 n) => (float[1,32,32,32] y) {
  c = Conv <pads = [1, 1, 1, 1]> (x0, w)
  x = Relu (c)
  t = Constant <value = bool {1}> ()
  y = Loop (n, t, x) <
    body = b (int64 i, bool ci, float[1,32,32,32] acc) => (bool co, float[1,32,32,32] acc2) {
      co = Identity (ci)
      half = Constant <value = float {0.5}> ()
      acc2 = Mul (acc, half)
    }
  >
}"""


@pytest.mark.parametrize("places", ["arm/fp16/nhwc,arm/fp32/nchw", "cuda/fp16/nchw", "opencl/fp16/nchw,arm/fp32/nchw"])
def test_a_loop_gets_its_carried_value_in_the_bodys_type_and_layout(places, tmp_path):
    """A convolution large enough to run in fp16 (and NHWC on ARM) feeds a Loop whose body declares float NCHW:
    the Loop's input is converted back (it went in fp16 and onnxruntime refused the model: 10 != 1)."""
    model = onnx.parser.parse_model(LOOP_AFTER_CONV)
    model.graph.initializer.append(tensor("w", weights(32, 32, 3, 3)))
    ctx, _ = placed(tmp_path, model, places)
    conv = next(n for n in ctx.graph if "Conv" in n.op_type)
    assert conv.pick.resolved.precision is Precision.FP16


def test_fp16_storage_converts_a_weight_only_a_body_reads_before_the_node_holding_the_body(tmp_path):
    """The calib from the fp16 weight went before the body's Conv, in the main graph, and the pass failed
    ("Node(Conv) is not in this graph"; soft: the weights stayed fp32). It goes before the If now."""
    model = onnx.parser.parse_model(BRANCHES)
    model.graph.initializer.append(tensor("w", weights(4, 4, 3, 3)))
    ctx, _ = placed(tmp_path, model, "x86/fp32/nchw", fp16_storage=True, strict=True)
    assert ctx.graph.initializers["w_fp16"].dtype == TensorProto.FLOAT16
    (calib,) = casts(ctx.graph)
    assert calib.graph is ctx.graph and [u.node.op_type for u in calib.output().uses] == ["FusedConvRelu"]


@pytest.mark.parametrize("places", ["arm/fp16/nhwc,arm/fp32/nchw", "opencl/fp16/nchw,arm/fp32/nchw"])
def test_a_mask_constant_beyond_fp16s_range_keeps_its_node_in_fp32_behind_a_calib(tmp_path, places):
    """An attention mask as transformers exports write it: Where(mask, finfo(float32).min, scores). The scores
    come in fp16; Where takes any precision and followed them into fp16, where the constant cannot be held:
    every kernel was refused and the run failed ("no kernel found"). It computes in fp32 after a calib."""
    source = tmp_path / "in.onnx"
    onnx.save(onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,8,64,64] x, bool[1,1,64,64] mask) => (float[1,8,64,64] z) {
            big = Constant <value = float {-3.4028235e+38}> ()
            y = MatMul (x, x)
            w = Where (mask, big, y)
            z = Softmax <axis = -1> (w)
        }"""), str(source))
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(places=places))
    assert report["verification"]["passed"] is True
    written = load_model(tmp_path / "out.onnx")
    [where] = [n for n in written.graph if n.op_type == "Where"]
    assert where.metadata["mirserve.place"].split("/")[1] == "fp32"
    assert where.input(1).dtype == TensorProto.FLOAT and float(where.input(1).constant_value()) < -3e38
    [matmul] = [n for n in written.graph if n.op_type == "MatMul"]
    assert matmul.metadata["mirserve.place"].split("/")[1] == "fp16"  # the scores, computed in fp16,
    assert cast_kind(where.input(2).producer) == "calib"              # are converted, not the constant
