"""eliminate_duplicate_initializer: equal weights merge; near misses (sign of zero, one element, shape) stay."""
import tracemalloc

import numpy as np
from onnx import helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import run
from worker.engine.passes.support.arrays import arrays_equal
from worker.engine.passes.fold.eliminate_duplicate_initializer import sample_key

STEP = ["eliminate_duplicate_initializer"]


def two_readers(w1, w2):
    nodes = [helper.make_node("Add", ["x", "w1"], ["y"]), helper.make_node("Add", ["x", "w2"], ["z"])]
    shape = list(np.broadcast_shapes(w1.shape, w2.shape))
    return make_model(nodes, [vinfo("x", shape=shape)], [vinfo("y", shape=shape), vinfo("z", shape=shape)],
                      [tensor("w1", w1), tensor("w2", w2)])


def test_equal_weights_merge(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    outcome = run(two_readers(w, w.copy()), STEP, tmp_path)
    adds = outcome.model.graph.nodes_of_type("Add")
    assert adds[0].input(1) is adds[1].input(1)
    assert outcome.entries["eliminate_duplicate_initializer"][0]["merged"] == {"w2": "w1"}


def test_near_misses_do_not_merge(tmp_path):
    base = np.random.default_rng(0).random((40, 40)).astype(np.float32)
    other = base.copy()
    other[13, 7] += 1  # not among the sampled elements
    assert sample_key(base) == sample_key(other)
    outcome = run(two_readers(base, other), STEP, tmp_path / "element")
    assert outcome.rewrites("eliminate_duplicate_initializer") == 0
    outcome = run(two_readers(np.zeros(4, np.float32), -np.zeros(4, np.float32)), STEP, tmp_path / "sign")
    assert outcome.rewrites("eliminate_duplicate_initializer") == 0


def test_broadcast_views_compare_by_their_one_value_without_memory():
    big = np.broadcast_to(np.float32(0.5), (8192, 8192))  # 256 MiB if it were materialized
    tracemalloc.start()
    try:
        assert arrays_equal(big, np.broadcast_to(np.float32(0.5), (8192, 8192)))
        assert not arrays_equal(big, np.broadcast_to(np.float32(0.25), (8192, 8192)))
        key = sample_key(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert key == np.full(64, 0.5, np.float32).tobytes()


def test_a_broadcast_view_and_an_equal_array_merge(tmp_path):
    view = np.broadcast_to(np.float32(0.5), (3, 4))
    assert sample_key(view) == sample_key(np.full((3, 4), 0.5, np.float32))
    assert arrays_equal(view, np.full((3, 4), 0.5, np.float32))


def test_initializers_fed_as_inputs_do_not_merge(tmp_path):
    nodes = [helper.make_node("Add", ["x", "a"], ["y"]), helper.make_node("Add", ["x", "b"], ["z"])]
    model = make_model(nodes, [vinfo("x", shape=[2]), vinfo("b", shape=[2])],
                       [vinfo("y", shape=[2]), vinfo("z", shape=[2])],
                       [tensor("a", np.ones(2, np.float32)), tensor("b", np.ones(2, np.float32))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.rewrites("eliminate_duplicate_initializer") == 0


def test_a_mapped_weight_is_fingerprinted_from_its_file_as_its_array_would_be(tmp_path):
    """The sample of a weight in external data is read with pread (no readahead window mapped into the
    resident set) and equals the sample of the same array in memory, so the grouping is unchanged."""
    import onnx
    from onnx import TensorProto, helper

    from worker.engine.ir import load_model
    from worker.engine.passes.fold.eliminate_duplicate_initializer import value_key

    array = np.random.default_rng(0).standard_normal((300, 70)).astype(np.float32)
    (tmp_path / "w.bin").write_bytes(b"\0" * 10 + array.tobytes())
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[300, 70], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "w.bin"), ("offset", "10"), ("length", str(array.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [300, 70])], [tensor])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    weight = load_model(tmp_path / "m.onnx", external_data_dir=tmp_path).graph.initializers["w"]
    key = value_key(weight)
    assert weight._const is None  # read from the file, not through the array
    assert key == sample_key(array) and len(key) == 64 * 4
    weight.const  # a pass looked at it: still the file's data, still read from the file
    reads = []
    original = weight.const_source.take
    weight.const_source.take = lambda positions: reads.append(len(positions)) or original(positions)
    assert value_key(weight) == key and reads == [64]
