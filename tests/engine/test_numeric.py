"""Numeric verification: agreement passes, a changed model fails naming the worst output, nothing to prove
when the input cannot run."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import CORPUS, make_model, tensor, vinfo
from worker.engine.errors import VerificationError
from worker.engine.numeric import verify


def two_outputs(tmp_path, name, scale):
    model = make_model([helper.make_node("Mul", ["x", "w"], ["y"]), helper.make_node("Relu", ["x"], ["r"])],
                       [vinfo("x", shape=["n", 4])], [vinfo("y", shape=["n", 4]), vinfo("r", shape=["n", 4])],
                       [tensor("w", np.full(4, scale, np.float32))])
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_identical_models_pass_with_per_output_figures(tmp_path):
    a, b = two_outputs(tmp_path, "a.onnx", 2.0), two_outputs(tmp_path, "b.onnx", 2.0)
    report = verify(a, b, input_shapes={"x": [3, 4]}, runs=3)
    assert report["passed"] is True and report["runs"] == 3
    assert [(o["name"], o["shape"], o["max_abs_diff"]) for o in report["outputs"]] == \
        [("y", [3, 4], 0.0), ("r", [3, 4], 0.0)]


def test_a_difference_beyond_tolerance_fails_naming_the_output(tmp_path):
    a, b = two_outputs(tmp_path, "a.onnx", 2.0), two_outputs(tmp_path, "b.onnx", 2.001)
    with pytest.raises(VerificationError, match="output 'y' differs by up to 0.00"):
        verify(a, b)
    report = verify(a, b, rtol=1e-2)  # within a looser tolerance
    assert report["passed"] and report["outputs"][0]["max_rel_diff"] == pytest.approx(5e-4, rel=1e-2)


def test_a_model_onnxruntime_cannot_load_is_a_verification_error(tmp_path):
    a = two_outputs(tmp_path, "a.onnx", 2.0)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(VerificationError, match="cannot load the optimized model"):
        verify(a, broken)


def test_nothing_to_prove_when_the_input_cannot_run(tmp_path):
    graph = helper.make_graph([helper.make_node("Mystery", ["x"], ["y"], domain="com.example")], "g",
                              [vinfo("x", shape=[2])], [vinfo("y", shape=[2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 10
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    report = verify(path, path)
    assert report["passed"] is None and "cannot run the input model" in report["skipped"]


def test_bert_int_inputs_are_generated(tmp_path):
    model = CORPUS / "bert_small_dyn.onnx"
    report = verify(model, model, input_shapes={"input_ids": [2, 16], "attention_mask": [2, 16]})
    assert report["passed"] and report["outputs"][0]["shape"] == [2, 16, 256]


def one_node(tmp_path, name, node, out_type=onnx.TensorProto.FLOAT, inits=()):
    model = make_model([node], [vinfo("x", shape=["n"])], [vinfo("y", out_type, shape=["m"])], list(inits))
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_the_same_infinities_and_nans_agree(tmp_path):
    path = one_node(tmp_path, "div.onnx", helper.make_node("Div", ["x", "z"], ["y"]),
                    inits=[tensor("z", np.zeros(1, np.float32))])  # x / 0: +inf, and NaN for x = 0
    report = verify(path, path, input_shapes={"x": [64]})
    assert report["passed"] is True and report["outputs"][0]["max_abs_diff"] == 0.0


def test_an_output_of_another_element_type_differs(tmp_path):
    a = one_node(tmp_path, "a.onnx", helper.make_node("Identity", ["x"], ["y"]))
    b = one_node(tmp_path, "b.onnx", helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.DOUBLE),
                 out_type=onnx.TensorProto.DOUBLE)
    with pytest.raises(VerificationError, match="element type float64 instead of float32"):
        verify(a, b, input_shapes={"x": [4]})


def test_nothing_to_prove_when_the_input_fails_on_the_inputs(tmp_path):
    path = one_node(tmp_path, "reshape.onnx", helper.make_node("Reshape", ["x", "s"], ["y"]),
                    inits=[tensor("s", np.array([3], np.int64))])
    report = verify(path, path, input_shapes={"x": [4]})
    assert report["passed"] is None and "cannot run the input model on inputs of shapes x=4" in report["skipped"]


def test_an_fp16_output_is_compared_at_fp16_resolution(tmp_path):
    """Two roundings of one fp16 computation differ by an ulp (~1e-3 relative): within fp16's tolerances
    whatever the run's, while 1 % is not."""
    half = onnx.TensorProto.FLOAT16

    def scaled(name, factor):
        model = make_model([helper.make_node("Mul", ["x", "k"], ["y"])], [vinfo("x", half, ["n"])],
                           [vinfo("y", half, ["n"])], [tensor("k", np.array([factor], np.float16))])
        onnx.save(model, str(tmp_path / name))
        return tmp_path / name

    one, ulp, far = scaled("a.onnx", 1.0), scaled("b.onnx", 1.0 + 2 ** -10), scaled("c.onnx", 1.03)
    assert verify(one, ulp, input_shapes={"x": [64]})["passed"] is True
    with pytest.raises(VerificationError, match="output 'y' differs"):
        verify(one, far, input_shapes={"x": [64]})


def _verify_in_process(reference, candidate, **request):
    """The child's side of ``verify``, run here (so a test can watch it), and the sessions it opened."""
    from worker.engine import numeric

    opened = []
    session = numeric._session

    def counting(source):
        opened.append(source if isinstance(source, str) else "bytes")
        return session(source)

    full = {"mode": "verify", "reference": str(reference), "candidate": str(candidate), "runs": 2, "rtol": 1e-4,
            "atol": 1e-5, "seed": 0, "chunk_bytes": 0, "same_weights": None, "values": {}, "given": {},
            "shape_sets": None, **request}
    numeric._session = counting
    try:
        return json.loads(json.dumps(numeric._child(full))), opened  # as the caller reads it
    finally:
        numeric._session = session


@pytest.mark.parametrize("shape_sets", [None, [{"x": [3, 4]}, {"x": [5, 4]}]], ids=["chosen", "given"])
def test_the_reference_runs_once_for_many_candidates_with_a_file_for_its_outputs(tmp_path, shape_sets):
    """``verify(expected=...)``: the first verification records the reference's outputs, the next ones read
    them and neither load nor run the reference, with the same report as without the file; another request
    (other draws) records again."""
    reference = two_outputs(tmp_path, "ref.onnx", 2.0)
    same, other = two_outputs(tmp_path, "same.onnx", 2.0), two_outputs(tmp_path, "other.onnx", 2.5)
    recorded = str(tmp_path / "reference.npz")
    for candidate in (same, other):
        plain, opened = _verify_in_process(reference, candidate, shape_sets=shape_sets)
        assert opened == [str(reference), str(candidate)]
    first, opened = _verify_in_process(reference, same, shape_sets=shape_sets, expected=recorded)
    assert opened == [str(reference), str(same)] and first["passed"] is True
    for candidate in (same, other, same):
        report, opened = _verify_in_process(reference, candidate, shape_sets=shape_sets, expected=recorded)
        assert opened == [str(candidate)]  # no reference session
        without, _ = _verify_in_process(reference, candidate, shape_sets=shape_sets)
        assert report == without
    assert report["passed"] is True and without["passed"] is True
    failed, _ = _verify_in_process(reference, other, shape_sets=shape_sets, expected=recorded)
    assert failed["passed"] is False and failed == _verify_in_process(reference, other, shape_sets=shape_sets)[0]
    again, opened = _verify_in_process(reference, same, shape_sets=shape_sets, expected=recorded, seed=1)
    assert opened == [str(reference), str(same)] and again["seed"] == 1  # other draws: recorded anew


def test_an_input_larger_than_the_check_may_allocate_is_refused_naming_it(tmp_path):
    """A declared [2^31, 2^31] input: numpy refused it with a bare ValueError that crashed the child."""
    from onnx import TensorProto

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**31, 2**31])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**31, 2**31])])
    path = tmp_path / "huge.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    with pytest.raises(VerificationError, match=r"verification cannot make input 'x' of shape "
                                                r"2147483648x2147483648: its values alone take 16 EiB"):
        verify(str(path), str(path), memory_mb=1024)


def test_an_input_that_never_runs_is_named_when_the_optimized_model_does_not_load(tmp_path):
    """An exporter's shapes that disagree fail the input when it runs, and the optimized model already at load
    once folding made them static (CANINE's TorchScript export): the input is the model at fault. (An input that
    runs keeps the optimized model named: test_a_model_onnxruntime_cannot_load_is_a_verification_error.)"""
    def reshape_matmul(name, x_shape, shape_nodes):
        nodes = [*shape_nodes, helper.make_node("Reshape", ["x", "s"], ["r"]),
                 helper.make_node("MatMul", ["r", "w"], ["y"])]
        inits = [tensor("three", np.array([3], np.int64)), tensor("w", np.ones((4, 2), np.float32))]
        if not shape_nodes:
            inits.append(tensor("s", np.array([2, 3], np.int64)))
        model = make_model(nodes, [vinfo("x", shape=x_shape)], [vinfo("y", shape=["m", 2])], inits)
        path = tmp_path / name
        onnx.save(model, str(path))
        return path

    computed = [helper.make_node("Shape", ["x"], ["n"]), helper.make_node("Div", ["n", "three"], ["rows"]),
                helper.make_node("Concat", ["rows", "three"], ["s"], axis=0)]  # [n / 3, 3]: known at run time
    given, folded = reshape_matmul("given.onnx", ["n"], computed), reshape_matmul("folded.onnx", [6], [])
    report = verify(given, folded, input_shapes={"x": [6]})
    assert report["passed"] is None and "cannot run the input model on inputs of shapes x=6" in report["skipped"]
    assert "the optimized model does not load either" in report["skipped"]
