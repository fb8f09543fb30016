"""Loading and saving: faithful round trips on real models, weights without copies, safe external data."""
from __future__ import annotations

import mmap
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import all_models, make_model, model_id, random_feeds, run_onnxruntime, shapes_for, tensor, vinfo
from worker.engine.errors import ModelError
from worker.engine.ir import Limits, load_model, model_to_proto, save_model
from worker.engine.ir.serde import MappedTensor
from worker.engine.ir.verify import verify_graph


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_round_trip_keeps_the_model(path, tmp_path):
    model = load_model(path)
    verify_graph(model.graph)
    out = tmp_path / "out.onnx"
    save_model(model, out)
    onnx.checker.check_model(str(out))
    original, written = onnx.load(str(path)), onnx.load(str(out))
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in original.graph.node]
    assert [i.name for i in written.graph.input] == [i.name for i in original.graph.input]
    assert [o.name for o in written.graph.output] == [o.name for o in original.graph.output]
    assert {(o.domain, o.version) for o in written.opset_import} == \
        {(o.domain, o.version) for o in original.opset_import}
    assert written.producer_name == original.producer_name
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in original.graph.initializer}
    for t in written.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), weights[t.name])
    feeds = random_feeds(path, shapes_for(path))
    for expected, actual in zip(run_onnxruntime(path, feeds), run_onnxruntime(out, feeds)):
        np.testing.assert_array_equal(actual, expected)  # bit-identical


def test_weights_are_views_of_the_mapped_file(tmp_path):
    weight = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vinfo("x", shape=[1, 64])],
                       [vinfo("y", shape=[1, 64])], [tensor("w", weight)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    loaded = load_model(path)
    w = loaded.graph.initializers["w"]
    assert isinstance(w.const_source, MappedTensor)
    array = w.const
    root = array
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if isinstance(root, memoryview):
        root = root.obj
    assert isinstance(root, mmap.mmap) and root is w.const_source.buffer, "the weight was copied"
    assert not array.flags.writeable, "a loaded weight must not be changed in place"
    np.testing.assert_array_equal(array, weight)


def test_changed_weight_is_written_and_untouched_ones_are_streamed(tmp_path):
    a, b = np.ones((32, 32), np.float32), np.full((32, 32), 2, np.float32)
    model = make_model([helper.make_node("Add", ["a", "b"], ["y"])], [], [vinfo("y", shape=[32, 32])],
                       [tensor("a", a), tensor("b", b)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    loaded = load_model(path)
    loaded.graph.initializers["a"].const = a * 5
    out = tmp_path / "out.onnx"
    save_model(loaded, out)
    result = run_onnxruntime(out, {})[0]
    np.testing.assert_array_equal(result, a * 5 + b)


def test_large_model_goes_to_external_data_beside_the_output(tmp_path):
    weight = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vinfo("x", shape=[1, 256])],
                       [vinfo("y", shape=[1, 256])], [tensor("w", weight)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "out.onnx"
    info = save_model(load_model(path), out, protobuf_limit=10_000)  # as if the model were over 2 GB
    assert info.external_data == tmp_path / "out.onnx.data"
    assert os.path.getsize(out) < 10_000 < os.path.getsize(info.external_data)
    x = np.ones((1, 256), np.float32)
    np.testing.assert_allclose(run_onnxruntime(out, {"x": x})[0], x @ weight, rtol=1e-4, atol=1e-4)
    reloaded = load_model(out, external_data_dir=tmp_path)
    np.testing.assert_array_equal(reloaded.graph.initializers["w"].const, weight)


def test_external_data_is_read_only_when_trusted_and_never_outside_the_model_dir(tmp_path):
    weight = np.ones((64, 64), np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vinfo("x", shape=[1, 64])],
                       [vinfo("y", shape=[1, 64])], [tensor("w", weight)])
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.bin", size_threshold=0)
    with pytest.raises(ModelError, match="external file 'm.bin'"):
        load_model(tmp_path / "m.onnx")
    assert load_model(tmp_path / "m.onnx", external_data_dir=tmp_path).graph.initializers["w"].const.sum() == 4096

    evil = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    for entry in evil.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../../etc/passwd"
    onnx.save(evil, str(tmp_path / "evil.onnx"))
    with pytest.raises(ModelError, match="leaves the model's directory"):
        load_model(tmp_path / "evil.onnx", external_data_dir=tmp_path)


def test_failed_check_leaves_nothing_behind(tmp_path):
    model = load_model(all_models()[-1])
    out = tmp_path / "out.onnx"

    def refuse(candidate):
        assert candidate.exists() and candidate != out
        raise RuntimeError("verification failed")

    with pytest.raises(RuntimeError):
        save_model(model, out, check=refuse)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, message", [
    (b"", "empty file"),
    (b"hello, this is text\n" * 10, "not an ONNX model"),
    (TensorProto(dims=[2], data_type=1, float_data=[1, 2]).SerializeToString(), "not an ONNX model"),
])
def test_not_an_onnx_model(tmp_path, content, message):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=message):
        load_model(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelError, match="no such file"):
        load_model(tmp_path / "missing.onnx")
    with pytest.raises(ModelError, match="is a directory"):
        load_model(tmp_path)


def test_truncated_weights_are_refused(tmp_path):
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [vinfo("y", shape=[512])],
                       [tensor("w", np.ones(512, np.float32))])
    model.graph.initializer[0].dims[0] = 600  # claims more data than it has
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="'w' has 2048 bytes of data, shape \\[600\\] needs 2400"):
        load_model(path)


def test_limits_are_checked_before_building_the_ir(tmp_path):
    path = all_models()[-1]
    with pytest.raises(ModelError, match="more than 10 nodes"):
        load_model(path, limits=Limits(max_nodes=10))
    with pytest.raises(ModelError, match="declares dimension 224"):
        load_model(path, limits=Limits(max_dim=100))


def test_undefined_input_is_named(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], "g",
                              [vinfo("x", shape=[1])], [vinfo("y", shape=[1])])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    with pytest.raises(ModelError, match="node 'r' \\(Relu\\) reads 'nowhere'"):
        load_model(path)


def test_if_bodies_see_outer_values_and_round_trip(tmp_path):
    then_graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"])], "then", [], [vinfo("t", shape=[4])])
    else_graph = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["e"])], "else", [], [vinfo("e", shape=[4])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)],
                       [vinfo("c", TensorProto.BOOL, []), vinfo("x", shape=[4])], [vinfo("y", shape=[4])],
                       [tensor("w", np.arange(4, dtype=np.float32))])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    loaded = load_model(path)
    x = loaded.graph.value("x")
    assert {use.node.op_type for use in x.uses} == {"Add", "Sub"}  # uses from inside the bodies
    assert all(use.node.graph.parent.op_type == "If" for use in x.uses)
    out = tmp_path / "out.onnx"
    save_model(loaded, out)
    feeds = {"c": np.array(False), "x": np.ones(4, np.float32)}
    np.testing.assert_array_equal(run_onnxruntime(out, feeds)[0], 1 - np.arange(4))


def test_model_to_proto_without_weights_declares_them_as_inputs():
    model = load_model(all_models()[4])  # light_bvlc_alexnet: small initializers only
    proto = model_to_proto(model, with_weights=False)
    names = {i.name for i in proto.graph.input}
    assert all(t.name in names or t.ByteSize() < 2048 for t in proto.graph.initializer)
