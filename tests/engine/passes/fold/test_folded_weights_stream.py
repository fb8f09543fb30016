"""Folded weights that are views (a ConstantOfShape fill, a transposed weight) are written block by block:
saving never holds a whole weight, and the bytes are those of the array."""
import tracemalloc

import numpy as np
import onnx
from onnx import numpy_helper

from worker.engine.ir import Graph, Model, Node, Value, model_to_proto, save_model
from worker.engine.ir.serde import ArrayPayload


def model_with(weight: np.ndarray) -> Model:
    graph = Graph("g")
    x = graph.add_input(Value("x", 1, weight.shape))
    w = graph.add_initializer("w", weight)
    node = graph.append(Node("Add", [x, w], [Value("y", 1, weight.shape)]))
    graph.set_outputs([node.output()])
    return Model(graph, ir_version=8, opset_imports={"": 17})


def test_a_fill_view_is_saved_without_holding_it(tmp_path):
    fill = np.broadcast_to(np.float32(0.25), (4096, 4096))  # 64 MiB once written
    tracemalloc.start()
    try:
        save_model(model_with(fill), tmp_path / "m.onnx")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20  # one 16 MiB block at most
    saved = onnx.load(str(tmp_path / "m.onnx"))
    data = numpy_helper.to_array(saved.graph.initializer[0])
    assert data.shape == (4096, 4096) and np.all(data == np.float32(0.25))


def test_strided_and_uniform_views_are_written_in_order(monkeypatch):
    base = np.arange(6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4)
    views = (base.transpose(2, 0, 1), base[:, ::2], np.broadcast_to(base[:1], (3, 5, 4)),
             np.broadcast_to(np.float32(3), (10,)))
    for block_bytes in (ArrayPayload.BLOCK_BYTES, 12):  # 12 bytes: row recursion and a partial last block
        monkeypatch.setattr(ArrayPayload, "BLOCK_BYTES", block_bytes)
        for view in views:
            payload = ArrayPayload(view)
            assert len(payload) == view.nbytes
            assert bytes(payload) == np.ascontiguousarray(view).tobytes()


def test_in_memory_proto_carries_view_weights():
    proto = model_to_proto(model_with(np.broadcast_to(np.int64(7), (3, 2))))
    np.testing.assert_array_equal(numpy_helper.to_array(proto.graph.initializer[0]), np.full((3, 2), 7))
