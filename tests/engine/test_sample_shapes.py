"""Dynamic input dims without flags: each open dim gets a role and values; verification runs the input model
on the first level that runs (batch 1, then batch 2), says which shapes it verified, and when none runs,
names the dims and shapes it tried and suggests --input-shape."""
from __future__ import annotations

import onnx
import pytest
from onnx import parser

from worker.engine import sample_shapes as sample
from worker.engine.api import optimize
from worker.engine.errors import OptionsError, VerificationError
from worker.engine.options import OptimizeOptions, parse_shape_arg
from worker.engine.sample_shapes import InputSpec

HEAD = '<ir_version: 8, opset_import: ["" : 18]>'


@pytest.mark.parametrize("name, role", [
    ("batch", "batch"), ("batch_size", "batch"), ("N", "batch"), ("seq_len", "sequence"),
    ("sequence_length", "sequence"), ("height", "spatial"), ("W", "spatial"), ("image_width", "spatial"),
    ("num_samples", "samples"), ("audio_length", "samples"), ("waveform", "samples"),
    ("unk__12", None), ("s0", None), ("p2o.DynamicDimension.1", None)])
def test_a_dims_name_says_its_role(name, role):
    assert sample.role_of_name(name) == role


def test_roles_by_position_for_images_ids_and_sequences():
    image = InputSpec("x", "float", (None, 3, None, None))
    channels_last = InputSpec("img", "float", (None, None, None, 3))
    ids = InputSpec("input_ids", "int64", (None, None))
    hidden = InputSpec("h", "float", (None, None, 768))
    assert [sample.role_of_position(image, a) for a in range(4)] == ["batch", "channels", "spatial", "spatial"]
    assert [sample.role_of_position(channels_last, a) for a in range(3)] == ["batch", "spatial", "spatial"]
    assert [sample.role_of_position(ids, a) for a in range(2)] == ["batch", "sequence"]
    assert sample.role_of_position(hidden, 1) == "sequence"


def test_a_waveforms_samples_are_hundreds_whatever_the_dim_is_called():
    """[batch, samples] float audio: unnamed (Silero's VAD), named samples, or named as a sequence (wav2vec2's
    input_values [batch_size, sequence_length]); a leading "samples" dim over features stays a batch."""
    specs = [InputSpec("input", "float", (1, None)), InputSpec("chunk", "float", ("batch", "num_samples")),
             InputSpec("input_values", "float", ("batch_size", "sequence_length")),
             InputSpec("features", "float", ("samples", 40))]
    roles = {d.key: d.role for d in sample.open_dims(specs)}
    assert roles == {"input[1]": "samples", "batch": "batch", "num_samples": "samples", "batch_size": "batch",
                     "sequence_length": "samples", "samples": "batch"}
    assert sample.assignment(sample.open_dims(specs[:1]), 0) == {"input[1]": 512}


#: A waveform's STFT framing: reflect padding of 64 on each side needs more than 64 samples.
FRAMED = '''
    g (float[1, T] audio) => (float[1, M] y) <int64[4] pads = {0, 64, 0, 64}> {
        y = Pad <mode = "reflect"> (audio, pads)
    }'''


def test_an_audio_model_is_verified_on_a_window_of_samples(tmp_path):
    report = run(tmp_path, model(tmp_path, FRAMED))
    assert report["verification"]["passed"] is True
    assert report["verification"]["shapes"] == [{"audio": [1, 512]}]


def test_a_dim_named_in_several_inputs_takes_one_value():
    specs = [InputSpec("input_ids", "int64", ("batch", None)), InputSpec("attention_mask", "int64", ("batch", "seq")),
             InputSpec("token_type_ids", "int64", ("batch", "seq"))]
    dims = sample.open_dims(specs)
    assert [(d.key, d.role) for d in dims] == [("batch", "batch"), ("input_ids[1]", "sequence"), ("seq", "sequence")]
    shapes = sample.shapes(specs, {}, sample.assignment(dims, 0))
    assert shapes == {"input_ids": (1, 16), "attention_mask": (1, 16), "token_type_ids": (1, 16)}
    assert sample.shapes(specs, {"input_ids": [4, 7]}, sample.assignment(dims, 1, batch=2))["input_ids"] == (4, 7)


def model(tmp_path, text: str, name="in.onnx"):
    proto = parser.parse_model(HEAD + text)
    onnx.checker.check_model(proto)
    onnx.save(proto, tmp_path / name)
    return tmp_path / name


def run(tmp_path, path, **options):
    return optimize(path, tmp_path / "out.onnx", OptimizeOptions(**options))


#: A model that runs only when H * W is a multiple of 25: not at 224 x 224, at 320 x 320.
STRIDED = '''
    g (float[N, 3, H, W] x) => (float[N, 3, M, 25] y) <int64[4] s = {0, 3, -1, 25}> {
        y = Reshape (x, s)
    }'''


def test_spatial_sizes_grow_until_the_model_runs_and_the_report_says_which(tmp_path):
    report = run(tmp_path, model(tmp_path, STRIDED))
    verification = report["verification"]
    assert verification["passed"] is True
    assert verification["shapes"] == [{"x": [1, 3, 320, 320]}, {"x": [2, 3, 320, 320]}]
    assert verification["dims"] == {"N": 1, "H": 320, "W": 320}
    assert "x=1x3x224x224" in verification["tried"][0]
    from worker.engine.trace_events import chrome_trace

    (slice_,) = [e for e in chrome_trace(report)["traceEvents"] if e["name"] == "verification" and e["ph"] == "X"]
    assert slice_["args"]["shapes"] == verification["shapes"]  # the Chrome trace says so too


def test_no_shape_runs_names_the_dims_tried_and_suggests_input_shape(tmp_path):
    path = model(tmp_path, '''
        g (float[N, 3, H, W] x) => (float[N, 3, 100, W] y) <int64[4] s = {0, 3, 100, -1}, int64[4] t = {1, 3, 100, 99}> {
            y = Reshape (x, s)
            f = Reshape (x, t)
        }''')
    with pytest.raises(VerificationError) as error:
        run(tmp_path, path)
    message = str(error.value)
    for fragment in ("H (spatial, at x[2])", "x=1x3x224x224", "x=1x3x320x320", "x=1x3x640x640",
                     "--input-shape NAME=D0,D1,..."):
        assert fragment in message
    assert not (tmp_path / "out.onnx").exists()
    report = run(tmp_path, path, input_shapes={"x": [1, 3, 100, 99]})  # the suggested way out
    assert report["verification"]["passed"] is True


def test_sequence_models_get_one_sequence_length_and_a_second_batch(tmp_path):
    path = model(tmp_path, '''
        g (int64[batch, seq] input_ids, int64[batch, seq] attention_mask) => (float[batch, seq, 4] y)
          <float[100, 4] table = {0.0}> {
            e = Gather (table, input_ids)
            m = Cast <to = 1> (attention_mask)
            u = Unsqueeze (m, axes)
            y = Mul (e, u)
        }'''.replace("{0.0}", "{" + ",".join(["0.5"] * 400) + "}").replace(
        "(m, axes)", "(m, a)").replace("<float[100, 4] table", "<int64[1] a = {-1}, float[100, 4] table"))
    report = run(tmp_path, path)
    assert report["verification"]["shapes"] == [{"input_ids": [1, 16], "attention_mask": [1, 16]},
                                                {"input_ids": [2, 16], "attention_mask": [2, 16]}]


def test_static_models_are_verified_as_declared(tmp_path):
    path = model(tmp_path, '''
        g (float[2, 3] x) => (float[2, 3] y) {
            y = Relu (x)
        }''')
    verification = run(tmp_path, path)["verification"]
    assert verification["shapes"] == [{"x": [2, 3]}] and "dims" not in verification


def test_without_verification_the_memory_plan_says_at_which_untried_shapes_it_planned(tmp_path):
    report = run(tmp_path, model(tmp_path, STRIDED), verify=False)
    assert report["verification"] is None
    assert report["memory"]["planned_at"]["shapes"] == {"x": [1, 3, 224, 224]}


@pytest.mark.parametrize("text", ["x=1,3,640,640", "x:1,3,640,640", "x:1x3x640x640", "x=1x3x640x640"])
def test_the_shape_syntaxes_users_type(text):
    assert parse_shape_arg(text) == ("x", (1, 3, 640, 640))


def test_a_name_with_colons_keeps_them():
    assert parse_shape_arg("input:0:1,3") == ("input:0", (1, 3))
    assert parse_shape_arg("input:0=1x3") == ("input:0", (1, 3))


@pytest.mark.parametrize("text", ["x", ":1,2", "x:1,a", "x=-1"])
def test_bad_shapes_are_refused_naming_the_forms(text):
    with pytest.raises(OptionsError, match=f"bad input shape {text!r}"):
        parse_shape_arg(text)


def test_a_sequence_input_is_not_verified_and_the_report_says_why(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("SequenceLength", ["s"], ["n"])], "g",
                              [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.save(proto, tmp_path / "seq.onnx")
    with pytest.raises(VerificationError, match="cannot be verified, so it is not written: verification cannot "
                                                "generate input 's'"):
        run(tmp_path, tmp_path / "seq.onnx")
    verification = run(tmp_path, tmp_path / "seq.onnx", allow_unverified=True)["verification"]
    assert verification["passed"] is None
    assert verification["skipped"] == "verification cannot generate input 's' of type seq(tensor(float))"


#: A decoder step with its KV cache as inputs: the keys are the cache and the new ones joined, and the mask
#: must cover them all (its length is past + sequence); a separate dim name on every input, as the dynamo
#: exporter writes them.
CACHED = '''
    g (float[batch, seq, 4] x, int64[batch, total] attention_mask, float[batch, 1, past, 4] past_key_0)
      => (float[batch, 1, seq, 4] y) <int64[4] s = {0, 1, -1, 4}> {
        q = Reshape (x, s)
        k = Concat <axis = 2> (past_key_0, q)
        kt = Transpose <perm = [0, 1, 3, 2]> (k)
        scores = MatMul (q, kt)
        m = Cast <to = 1> (attention_mask)
        mu = Unsqueeze (m, a)
        masked = Mul (scores, mu)
        w = Softmax <axis = -1> (masked)
        y = MatMul (w, k)
    }'''.replace("<int64[4] s", "<int64[2] a = {1, 2}, int64[4] s")


def test_a_kv_cache_and_its_mask_take_related_lengths(tmp_path):
    specs = [InputSpec("x", "float", ("batch", "seq", 4)), InputSpec("attention_mask", "int64", ("batch", "total")),
             InputSpec("past_key_0", "float", ("batch", 1, "past", 4))]
    dims = sample.open_dims(specs)
    assert {d.key: d.role for d in dims} == {"batch": "batch", "seq": "sequence", "total": "total", "past": "past"}
    for level in range(sample.LEVELS):
        values = sample.assignment(dims, level)
        assert values["total"] == values["past"] + values["seq"]
    report = run(tmp_path, model(tmp_path, CACHED))
    assert report["verification"]["passed"] is True
    first = report["verification"]["shapes"][0]
    assert first["attention_mask"][1] == first["past_key_0"][2] + first["x"][1]
