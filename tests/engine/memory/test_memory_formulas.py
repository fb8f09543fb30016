"""Memory of a model with open input dims as formulas of those dims: fitted to plans at several sizes, checked
at others, evaluated at any size (what GET /jobs/{id}/memory?dims=... answers)."""
from __future__ import annotations

import onnx
import pytest
from onnx import parser

from worker.engine.api import memory_at, optimize
from worker.engine.errors import OptionsError
from worker.engine.memory.formulas import Sample, fit_memory, formula_text, parse_dims
from worker.engine.options import OptimizeOptions
from worker.engine.passes.memory.memory_plan import ScaledShapes
from tests.conftest import CORPUS


def attention_like(point):
    """Buffers of a transformer block: b*s*768*4 activations, b*12*s*s*4 scores, a b*4 pooled vector."""
    b, s = point["batch"], point["seq"]
    sizes = {"hidden": b * s * 3072, "scores": b * s * s * 48, "pooled": b * 4, "shape": 32}
    arena = sizes["hidden"] * 2 + sizes["scores"] + 64
    return Sample({"host": arena}, {"host": arena - 64}, b * s * 16, sizes)


def test_the_formula_of_a_polynomial_plan_is_exact_and_checked():
    fitted = fit_memory(attention_like, {"batch": 1, "seq": 16})
    arena = fitted["spaces"]["host"]["arena_bytes"]
    assert arena["formula"] == "48*batch*seq^2 + 6144*batch*seq + 64"
    assert arena["max_relative_error"] == 0.0
    assert fitted["io_bytes"]["formula"] == "16*batch*seq"
    assert fitted["checked_at"] == [{"batch": 3, "seq": 48}, {"batch": 4, "seq": 64}]
    memory = {"symbolic": fitted, "weights_bytes": {"host": 100}}
    at = memory_at(memory, "batch=8,seq=512")
    assert at["arenas"] == [{"space": "host", "arena_bytes": attention_like({"batch": 8, "seq": 512}).arena["host"],
                             "arena_formula": arena["formula"], "peak_bytes": 48 * 8 * 512 ** 2 + 6144 * 8 * 512,
                             "peak_formula": "48*batch*seq^2 + 6144*batch*seq"}]
    assert at["io_bytes"] == 16 * 8 * 512 and at["extrapolated"] == ["batch", "seq"]


def test_an_unplanned_space_has_no_formula_but_says_why():
    def plan(point):
        return Sample({"host": None}, {"host": None}, None, {"v": point["n"] * 4})

    fitted = fit_memory(plan, {"n": 1})
    assert fitted["spaces"]["host"]["arena_bytes"]["formula"] is None
    assert "not planned at every size" in fitted["spaces"]["host"]["arena_bytes"]["reason"]


@pytest.mark.parametrize("text, message", [
    ("batch=8", "seq missing"), ("batch=8,seq=2,heads=3", "'heads' is not one of them"),
    ("batch=eight,seq=2", "'eight' is not an integer"), ("batch", "expected NAME=N"),
    ("batch=-1,seq=2", "must not be negative")])
def test_bad_dims_are_refused_naming_the_models_dims(text, message):
    with pytest.raises(OptionsError, match=message) as error:
        parse_dims(text, ["batch", "seq"])
    assert error.value.field == "dims"


def test_formula_text_orders_terms_by_degree():
    assert formula_text([(7, (0, 0)), (-2, (1, 0)), (3, (1, 2))], ["b", "s"]) == "3*b*s^2 - 2*b + 7"


def test_a_dynamic_model_is_planned_at_its_sample_shapes_with_formulas_that_hold_elsewhere(tmp_path):
    """The plan at other sizes (static input shapes) is what the formulas of the dynamic plan say."""
    model = parser.parse_model('''<ir_version: 8, opset_import: ["" : 18]>
        g (float[batch, seq, 64] x) => (float[batch, seq, 64] y) <float[64, 64] w = {0.5}, float[1] k = {0.125}> {
            q = MatMul (x, w)
            t = Transpose <perm = [0, 2, 1]> (q)
            s = MatMul (q, t)
            a = Softmax <axis = -1> (s)
            o = MatMul (a, x)
            p = Mul (o, k)
            y = Add (p, x)
        }'''.replace("{0.5}", "{" + ",".join(["0.5"] * 4096) + "}"))
    onnx.save(model, tmp_path / "in.onnx")
    report = optimize(tmp_path / "in.onnx", tmp_path / "out.onnx", OptimizeOptions())
    memory = report["memory"]
    assert memory["planned_at"]["shapes"] == {"x": [1, 16, 64]} == report["verification"]["shapes"][0]
    formula = memory["symbolic"]["spaces"]["host"]["arena_bytes"]
    assert "batch*seq^2" in formula["formula"] and formula["max_relative_error"] < 0.05
    static = optimize(tmp_path / "in.onnx", tmp_path / "static.onnx",
                      OptimizeOptions(input_shapes={"x": [2, 100, 64]}, verify=False))["memory"]
    at = memory_at(memory, "batch=2,seq=100")
    planned = static["arenas"][0]["arena_bytes"]
    assert abs(at["arenas"][0]["arena_bytes"] - planned) <= 0.05 * planned
    assert at["arenas"][0]["peak_bytes"] == static["arenas"][0]["lower_bound_bytes"]


def _symbolic(path, tmp_path, monkeypatch=None, **options):
    """The memory formulas of a run without verification; with ``monkeypatch``, every point typed by inference."""
    if monkeypatch is not None:
        monkeypatch.setattr(ScaledShapes, "at", lambda self, point, trusted=True: None)
    report = optimize(path, tmp_path / "out.onnx", OptimizeOptions(verify=False, **options))
    return report["memory"]["symbolic"]


def test_scaled_shapes_plan_the_fits_extra_points_as_inferring_types_there_would(tmp_path, monkeypatch):
    """BERT's dims are all products of batch and seq: the extra fit points are planned from scaled shapes,
    and every formula, fitted figure and check error is what typing each point by inference gives."""
    path = CORPUS / "bert_small_dyn.onnx"
    scaled = _symbolic(path, tmp_path)
    assert scaled["scaled_at"], "no fit point was planned from scaled shapes"
    inferred = _symbolic(path, tmp_path, monkeypatch)
    assert inferred["scaled_at"] == []
    assert {k: v for k, v in scaled.items() if k != "scaled_at"} == {k: v for k, v in inferred.items()
                                                                      if k != "scaled_at"}


def test_a_dim_that_is_not_a_product_of_the_open_dims_is_inferred_at_every_point(tmp_path):
    """``seq + 1`` (a class token before the sequence) does not double with seq: nothing is scaled."""
    model = parser.parse_model('''<ir_version: 8, opset_import: ["" : 18]>
        g (float[batch, seq, 8] x, float[batch, 1, 8] c) => (float[batch, ?, 8] y) {
            t = Concat <axis = 1> (c, x)
            y = Relu (t)
        }''')
    onnx.save(model, tmp_path / "in.onnx")
    symbolic = _symbolic(tmp_path / "in.onnx", tmp_path)
    assert symbolic["scaled_at"] == []


@pytest.mark.parametrize("seq, scaled", [(2, False), (16, True)])
def test_scaled_shapes_are_used_only_where_the_check_points_confirm_them(tmp_path, monkeypatch, seq, scaled):
    """Pooling by 4 windows (ceil): at seq=2 the pooled length is 1 at the base and doubled, so it looks
    constant until the check at x3 (2 windows) refutes it, and every fit point is inferred; at seq=16 it is
    seq / 4 at every multiple and the extra fit points are scaled. The formulas are the inferred ones."""
    model = parser.parse_model('''<ir_version: 8, opset_import: ["" : 18]>
        g (float[batch, 4, seq] x) => (float[batch, 4, ?] y, float[batch, 4, seq] z, float[batch, 4, 1] b,
                                       float[1, 4, seq] s) <int64[1] first = {0}> {
            y = MaxPool <kernel_shape = [4], strides = [4], ceil_mode = 1> (x)
            z = Relu (x)
            b = GlobalMaxPool (x)
            s = ReduceMax <keepdims = 1> (x, first)
        }''')  # sizes in batch*seq, batch and seq: the fit needs points beyond the doubled ones
    onnx.save(model, tmp_path / "in.onnx")
    found = _symbolic(tmp_path / "in.onnx", tmp_path, dim_bounds={"seq": seq})
    assert found["base"]["seq"] == seq
    assert bool(found["scaled_at"]) is scaled
    inferred = _symbolic(tmp_path / "in.onnx", tmp_path, monkeypatch, dim_bounds={"seq": seq})
    assert {k: v for k, v in found.items() if k != "scaled_at"} == {k: v for k, v in inferred.items()
                                                                     if k != "scaled_at"}
