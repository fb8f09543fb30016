"""Kernel pick rules: applicability, resolution of ``any``, Paddle-Lite's grade, user-order tie-break."""
from onnx import TensorProto

from worker.engine.kernels import default_table
from worker.engine.kernels.pick import (NodeFacts, Port, ValueFacts, first_place, grade, place_match, rank, refusal,
                                 resolve)
from worker.engine.kernels.schema import kernel_from_dict
from worker.engine.places import Layout, Precision, parse_places

F32, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def kernel(target, precision, layout, op="Relu", **extra):
    data = {"op": op, "domain": "", "since": 1, "until": None, "precision": precision, "layout": layout,
            "inputs": [{"name": "X"}], "outputs": [{"name": "Y"}], "origin": "test"}
    data.update(extra)
    return kernel_from_dict(data, target=target, where="test")


def unary(dtype=F32, precision=Precision.FP32, layout=Layout.NCHW, rank_=4, op="Relu"):
    x = ValueFacts(dtype=dtype, rank=rank_, precision=precision, layout=layout)
    return NodeFacts(op, "", 13, (x,), (ValueFacts(dtype=dtype, rank=rank_),))


def test_place_match_weights_target_over_precision_and_layout():
    places = parse_places("arm/fp16/nhwc")
    place = places.places[0]
    assert place_match(kernel("arm", "fp16", "nhwc"), place) == 255 + 127 + 63
    assert place_match(kernel("arm", "fp32", "nchw"), place) == 255
    assert place_match(kernel("host", "fp16", "nhwc"), place) == 127 + 63
    assert place_match(kernel("arm", "any", "any"), place) == 255 + 127 + 63


def test_grade_is_paddle_lites_formula():
    places = parse_places("arm/fp16/nhwc,arm/fp32/nchw")   # + host/fp16/nhwc, host/fp32/nchw: N = 4
    node = unary(F16, Precision.FP16, Layout.NHWC)
    best = grade(resolve(kernel("arm", "fp16", "nhwc"), node), node, places)
    assert best.score == (445 * 1.0 + 1) * 2 * 2
    second = grade(resolve(kernel("arm", "fp32", "nchw"), node), node, places)
    # vs place 0 the fp32 kernel only matches the target (255); vs place 1 fully, weighted 3/4; fp16 and
    # fp32 count as compatible (Paddle-Lite's PrecTypeCompatible), so +1 and both doublings.
    assert second.score == (max(255, 445 * 0.75) + 1) * 2 * 2
    int64 = NodeFacts("Relu", "", 13, (ValueFacts(dtype=I64, rank=4, precision=Precision.INT64),),
                      (ValueFacts(dtype=I64, rank=4),))
    any_kernel = grade(resolve(kernel("arm", "any", "any"), int64), int64, places)
    assert any_kernel.score == (445 + 1) * 2 * 2


def test_int8_and_float_precisions_are_not_compatible():
    from worker.engine.kernels.pick import compatible
    assert compatible(Precision.FP32, Precision.FP16) and compatible(Precision.INT64, Precision.ANY)
    assert not compatible(Precision.INT8, Precision.FP32) and not compatible(Precision.INT64, Precision.INT32)


def test_target_outweighs_precision_and_layout_together():
    # vs place 0, host/fp16/nhwc matches precision and layout (190), arm/fp32/nchw only the target (255)
    node = unary(F32, Precision.FP32)
    places = parse_places("arm/fp16/nhwc,arm/fp32/nchw,host/fp16/nhwc", host_fallback=False)
    scored, refused = rank([kernel("host", "fp16", "nhwc"), kernel("arm", "fp32", "nchw")], node, places)
    assert not refused
    assert scored[0].kernel.target == "arm"


def test_kernels_outside_every_valid_place_are_refused_with_a_reason():
    places = parse_places("arm/fp32/nchw")
    scored, refused = rank([kernel("arm", "fp16", "nchw"), kernel("arm", "fp32", "nchw")], unary(), places)
    assert [s.kernel.precision for s in scored] == [Precision.FP32]
    assert "no valid place allows" in refused[0][1]


def test_ties_go_to_the_users_order_where_paddle_lite_uses_its_enum_order():
    # The user prefers arm/fp16/nhwc over arm/fp32/nhwc but lists three other places first, so both
    # candidates score only their partial match with place 0 (target + layout = 318): a tie.
    places = parse_places("arm/int32/nhwc,x86/fp32/nchw,cuda/fp32/nchw,arm/fp16/nhwc,arm/fp32/nhwc")
    fp32, fp16 = kernel("arm", "fp32", "nhwc"), kernel("arm", "fp16", "nhwc")
    node = unary(F32, Precision.ANY)
    scored, refused = rank([fp32, fp16], node, places)
    assert not refused
    assert scored[0].score == scored[1].score
    assert scored[0].kernel is fp16

    # Paddle-Lite walks a std::set<Place>, ordered by its enums (paddle_place.h: PrecisionType kFloat = 1
    # before kFP16 = 5), and stable-sorts by score: on a tie it keeps the fp32 kernel first.
    paddle_precision_enum = {"fp32": 1, "int8": 2, "int32": 3, "any": 4, "fp16": 5, "bool": 6, "int64": 7}
    paddle_first = min([fp32, fp16], key=lambda k: paddle_precision_enum[k.precision.value])
    assert paddle_first is fp32 and paddle_first is not scored[0].kernel


def test_float_kernels_take_fp32_or_fp16_but_not_integers():
    arm_fp16 = kernel("arm", "fp16", "nchw")
    assert refusal(arm_fp16, unary(F32)) is None
    assert "does not take int64 at input 0" in refusal(arm_fp16, unary(I64, Precision.INT64))
    int64 = kernel("arm", "int64", "nchw", op="Add")
    assert refusal(int64, unary(I64, Precision.INT64)) is None
    assert refusal(int64, unary(F32)) is not None


def test_any_kernels_respect_their_types():
    erf = kernel("arm", "any", "nchw", op="Erf", types=["float"])
    assert refusal(erf, unary(F32)) is None
    assert "does not take int64" in refusal(erf, unary(I64, Precision.INT64))
    # fp16 data is taken through a calib to the float type the kernel lists
    half = unary(F16, Precision.FP16)
    assert refusal(erf, half) is None and resolve(erf, half).precision is Precision.FP32


def test_constraints_refuse_with_sentences():
    table = default_table()
    [nhwc] = [k for k in table.kernels("Conv", "", opset=13, targets=["arm"])
              if k.layout is Layout.NHWC and k.precision is Precision.FP16]
    x = ValueFacts(dtype=F32, rank=4, precision=Precision.FP32)
    w_const = ValueFacts(dtype=F32, rank=4, shape=(8, 3, 3, 3), is_constant=True)
    w_live = ValueFacts(dtype=F32, rank=4, shape=(8, 3, 3, 3))
    y = ValueFacts(dtype=F32, rank=4)
    ok = NodeFacts("Conv", "", 13, (x, w_const), (y,), {"auto_pad": "NOTSET", "group": 1})
    assert refusal(nhwc, ok) is None
    live = NodeFacts("Conv", "", 13, (x, w_live), (y,), {"auto_pad": "NOTSET", "group": 1})
    assert "input 1 to be a constant" in refusal(nhwc, live)
    same = NodeFacts("Conv", "", 13, (x, w_const), (y,), {"auto_pad": "SAME_UPPER", "group": 1})
    assert "attribute auto_pad" in refusal(nhwc, same)
    flat = NodeFacts("Conv", "", 13, (ValueFacts(dtype=F32, rank=3), w_const), (y,), {"auto_pad": "NOTSET"})
    assert "rank in [4]" in refusal(nhwc, flat)


def test_any_precision_and_layout_resolve_from_live_inputs():
    add = [k for k in default_table().kernels("Add", "", opset=13, targets=["host"])][0]
    a = ValueFacts(dtype=F16, rank=4, precision=Precision.FP16, layout=Layout.NHWC)
    bias = ValueFacts(dtype=F32, rank=3, shape=(8, 1, 1), is_constant=True, precision=Precision.FP32)
    node = NodeFacts("Add", "", 13, (a, bias), (ValueFacts(dtype=F32, rank=4),))
    resolved = resolve(add, node)
    assert (resolved.precision, resolved.layout) == (Precision.FP16, Layout.NHWC)
    assert resolved.inputs[1] == Port("host", Precision.FP16, Layout.NHWC)  # the constant gets converted offline
    # a live input of another rank pins the layout to nchw: broadcasting would misalign otherwise
    vec = ValueFacts(dtype=F16, rank=1, precision=Precision.FP16)
    node = NodeFacts("Add", "", 13, (a, vec), (ValueFacts(dtype=F32, rank=4),))
    assert resolve(add, node).layout is Layout.NCHW


def test_first_place_is_none_outside_the_valid_places():
    places = parse_places("opencl/fp16/nchw", host_fallback=False)
    assert first_place(kernel("opencl", "fp16", "nchw"), places) == 0
    assert first_place(kernel("opencl", "any", "any"), places) == 0
    assert first_place(kernel("opencl", "fp32", "nchw"), places) is None
    assert first_place(kernel("arm", "fp16", "nchw"), places) is None
