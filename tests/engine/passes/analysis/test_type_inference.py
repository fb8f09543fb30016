"""type_inference: every value typed and static with static input shapes; symbolic names kept without."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper

from tests.conftest import CORPUS, all_models, make_model, model_id, shapes_for, tensor, vinfo
from worker.engine.errors import OptionsError
from worker.engine.ir import load_model
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.places import parse_places


def typed(proto: onnx.ModelProto, tmp_path):
    """``proto`` saved, loaded and typed (``infer``)."""
    onnx.save(proto, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    infer(loaded)
    return loaded


def infer(model, shapes=None) -> dict:
    apply_input_shapes(model.graph, shapes or {})
    ctx = PassContext(model, OptimizeOptions(), parse_places())
    return PassManager().run(ctx, ["type_inference"])[0]


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_every_value_is_typed_and_static_with_static_input_shapes(path):
    model = load_model(path)
    entry = infer(model, shapes_for(path))
    assert entry["untyped"] == []
    assert entry["typed"] == entry["static"] == entry["values"] > 0
    for graph in model.graph.all_graphs():
        for value in graph.values():
            if value.is_used:
                assert value.dtype and value.is_static, value


def test_symbolic_dims_keep_their_names_without_input_shapes():
    model = load_model(CORPUS / "bert_small_dyn.onnx")
    entry = infer(model)
    assert entry["untyped"] == [] and entry["static"] < entry["values"]
    assert {"batch", "seq"} <= set(entry["symbolic_dims"])
    assert model.graph.outputs[0].shape == ("batch", "seq", 256)


def test_stale_value_info_is_replaced_by_inferred_shapes():
    model = load_model(CORPUS / "cls_qdq.onnx")  # carries [-1, 8, unk__0, unk__1] from the quantizer
    infer(model, {"x": [1, 3, 48, 192]})
    conv = model.graph.nodes_of_type("Conv")[0]
    assert conv.output().shape == (1, 8, 24, 96)


def test_values_it_cannot_infer_are_listed(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]),
                               helper.make_node("Mystery", ["a"], ["b"], domain="com.example"),
                               helper.make_node("Relu", ["b"], ["y"])], "g",
                              [vinfo("x", shape=[2])], [helper.make_empty_tensor_value_info("y")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    onnx.save(proto, str(tmp_path / "m.onnx"))
    entry = infer(load_model(tmp_path / "m.onnx"))
    assert entry["untyped"] == ["b", "y"]
    assert entry["typed"] == entry["values"] - 2


def test_shape_subgraph_values_are_evaluated(tmp_path):
    # Reshape to Concat(Shape(x)[0:1], [-1]): onnx alone cannot tell the output shape.
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["s0"]),
             helper.make_node("Concat", ["s0", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", 3, 4])], [vinfo("y", shape=[None, None])],
                       [tensor("zero", np.array([0])), tensor("one", np.array([1])),
                        tensor("minus_one", np.array([-1]))])
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    infer(loaded, {"x": [5, 3, 4]})
    assert loaded.graph.outputs[0].shape == (5, 12)


def test_if_bodies_are_typed(tmp_path):
    then_graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                                   [vinfo("t", shape=["n", 2])])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vinfo("e", shape=["n", 2])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)],
                       [vinfo("c", TensorProto.BOOL, []), vinfo("x", shape=["n", 2])], [vinfo("y", shape=["n", 2])])
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    entry = infer(loaded, {"x": [3, 2]})
    body = loaded.graph.nodes_of_type("If")[0].attr("then_branch")
    assert body.value("t").shape == (3, 2) and entry["untyped"] == []


@pytest.mark.parametrize("shapes, message", [
    ({"images": [1, 3, 48, 192]}, "input shape given for 'images', but the model's inputs are 'x'"),
    ({"x": [1, 3, 48]}, "input shape of 'x' has 3 dims, the model declares rank 4"),
    ({"x": [1, 4, 48, 192]}, "input shape of 'x': dim 1 is 3 in the model, 4 given"),
])
def test_bad_input_shapes_are_refused(shapes, message):
    model = load_model(CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    with pytest.raises(OptionsError, match=message):
        apply_input_shapes(model.graph, shapes)


def loop_model(tmp_path, condition_from_body: bool):
    """Loop(M=4, cond=True): acc += x, scanning acc; the body may pass its condition through or compute it."""
    cond_node = (helper.make_node("Less", ["acc_sum", "limit"], ["cond_out"]) if condition_from_body
                 else helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    nodes = [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
             helper.make_node("ReduceSum", ["acc_out"], ["acc_sum"], keepdims=0),
             cond_node, helper.make_node("Identity", ["acc_out"], ["scan_out"])]
    body = helper.make_graph(nodes, "body",
                             [vinfo("i", TensorProto.INT64, []), vinfo("cond_in", TensorProto.BOOL, []),
                              vinfo("acc_in", shape=[2, 3])],
                             [vinfo("cond_out", TensorProto.BOOL, []), vinfo("acc_out", shape=[2, 3]),
                              vinfo("scan_out", shape=[2, 3])])
    graph = helper.make_graph([helper.make_node("Loop", ["M", "c", "init"], ["final", "scans"], body=body)], "g",
                              [vinfo("x", shape=[2, 3]), vinfo("init", shape=[2, 3])],
                              [vinfo("final", shape=None), vinfo("scans", shape=None)],  # declared without shapes
                              [tensor("M", np.array(4, np.int64)), tensor("c", np.array(True)),
                               tensor("limit", np.array(100.0, np.float32))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "loop.onnx"))
    return load_model(tmp_path / "loop.onnx")


def test_loop_carried_and_scan_outputs_get_shapes(tmp_path):
    model = loop_model(tmp_path, condition_from_body=False)
    entry = infer(model)
    assert entry["untyped"] == []
    assert [(v.name, v.shape) for v in model.graph.outputs] == [("final", (2, 3)), ("scans", (4, 2, 3))]


def test_loop_stopped_by_its_body_keeps_an_unknown_scan_length(tmp_path):
    model = loop_model(tmp_path, condition_from_body=True)
    infer(model)
    final, scans = model.graph.outputs
    assert final.shape == (2, 3)  # the carried value keeps its shape however many iterations run
    assert scans.shape is not None and not isinstance(scans.shape[0], int)


ACCUMULATOR = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x, int64 n) => (float[N,4] y) {
  t = Constant <value = bool {1}> ()
  e = Constant <value = float[0,4] {}> ()
  y = Loop (n, t, e) <
    body = b (int64 i, bool ci, float[0,4] acc) => (bool co, float[L,4] acc2) {
      co = Identity (ci)
      fi = Cast <to = 1> (i)
      row = Add (x, fi)
      acc2 = Concat <axis = 0> (acc, row)
    }
  >
}"""


def test_a_carried_value_declared_at_its_first_shape_is_loosened_to_what_every_trip_holds(tmp_path):
    """The TorchScript exporter declares an accumulator its first trip's shape (Mask R-CNN's pasted masks:
    float[0,320,320]); one row is appended a trip, so its rows are unknown inside the body and the Concat that
    appends them is no Concat with an empty input (eliminate_nop_concat took it for one: [1, 4] came out
    instead of [17, 4])."""
    from worker.engine.api import optimize

    path = tmp_path / "acc.onnx"
    onnx.save(onnx.parser.parse_model(ACCUMULATOR), path)
    model = load_model(path)
    infer(model)
    body = model.graph.nodes_of_type("Loop")[0].attr("body")
    assert body.inputs[2].shape == (None, 4) and body.outputs[1].shape[1] == 4
    assert not isinstance(body.outputs[1].shape[0], int)
    report = optimize(path, tmp_path / "out.onnx", OptimizeOptions())
    assert report["verification"]["passed"] is True
    assert any(n.op_type == "Concat" for g in load_model(tmp_path / "out.onnx").graph.all_graphs() for n in g)


def pad_chain(links: int = 12):
    """swin_v2's shifted windows (TorchScript) in small: each Pad's pads come from the shape of the last Pad's
    output through a Mod onnx does not evaluate, so each round of inference learns one more link."""
    inits = [tensor("height_index", np.array(2)), tensor("three", np.array(3)), tensor("one", np.array(1)),
             tensor("zeros6", np.zeros(6, np.int64)), tensor("zeros1", np.zeros(1, np.int64)),
             tensor("axes0", np.array([0]))]
    nodes, x = [], "x"
    for i in range(links):
        nodes += [helper.make_node("Shape", [x], [f"s{i}"]),
                  helper.make_node("Gather", [f"s{i}", "height_index"], [f"g{i}"], axis=0),
                  helper.make_node("Mod", [f"g{i}", "three"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", "one"], [f"p{i}"]),
                  helper.make_node("Unsqueeze", [f"p{i}", "axes0"], [f"u{i}"]),
                  helper.make_node("Concat", ["zeros6", f"u{i}", "zeros1"], [f"pads{i}"], axis=0),
                  helper.make_node("Pad", [x, f"pads{i}"], [f"y{i}"])]
        x = f"y{i}"
    height = 4
    for _ in range(links):
        height += height % 3 + 1
    return make_model(nodes, [vinfo("x", shape=[1, 4, 4, 8])], [vinfo(x, shape=[1, 4, None, 8])], inits), height


def test_a_chain_of_pads_sized_by_the_last_output_is_typed_to_its_end(tmp_path):
    """Twelve links, as a 12-block model has: every value static, the last output's height known."""
    model, height = pad_chain(12)
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    entry = infer(loaded)
    assert entry["untyped"] == [] and entry["static"] == entry["values"], entry
    assert loaded.graph.outputs[0].shape == (1, 4, height, 8)


def test_positions_of_a_symbolic_sequence_keep_its_name(tmp_path):
    """torch.arange(ids.size(1)) -> a position embedding, added to the token embeddings: Range(0, s, 1) is s
    long, so the sum stays (n, s, 8) instead of taking a made-up dim from the Range."""
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
             helper.make_node("Cast", ["s"], ["s64"], to=TensorProto.INT64),
             helper.make_node("Range", ["zero", "s64", "one"], ["positions"]),
             helper.make_node("Gather", ["table", "positions"], ["pe"], axis=0),
             helper.make_node("Gather", ["table", "ids"], ["te"], axis=0), helper.make_node("Add", ["te", "pe"], ["y"])]
    model = make_model(nodes, [vinfo("ids", TensorProto.INT64, ["n", "s"])], [vinfo("y", shape=[None, None, None])],
                       [tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
                        tensor("table", np.zeros((16, 8), np.float32))])
    loaded = typed(model, tmp_path)
    assert loaded.graph.value("positions").shape == ("s",)
    assert loaded.graph.outputs[0].shape == ("n", "s", 8)


def test_a_range_that_does_not_start_at_zero_is_not_named(tmp_path):
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
             helper.make_node("Range", ["one", "s", "one"], ["y"])]
    model = make_model(nodes, [vinfo("ids", TensorProto.INT64, ["n", "s"])], [vinfo("y", TensorProto.INT64, [None])],
                       [tensor("one", np.array(1, np.int64))])
    loaded = typed(model, tmp_path)
    (dim,) = loaded.graph.outputs[0].shape
    assert dim != "s"


def _bert_embeddings(end_source: str = "s", start: int = 0) -> onnx.ModelProto:
    """BERT's embeddings as the TorchScript exporter writes them for a dynamic sequence: position ids are
    ``buffer[:, :s]`` (a Slice of a [1, 16] constant to the sequence's length), token types the same slice
    expanded to (n, s) through ``Where(Equal(v, -1), 1, v)``, both gathered and added to the token embeddings."""
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]), helper.make_node("Unsqueeze", ["s", "axes"], ["s1"]),
             helper.make_node("Slice", ["buffer", "start", f"{end_source}1", "axis1", "step"], ["positions"]),
             helper.make_node("Slice", ["types", "type_start", "s1", "axis1", "step"], ["type_slice"]),
             helper.make_node("Concat", ["n1", "s1"], ["sizes"], axis=0),
             helper.make_node("Reshape", ["sizes", "minus_one"], ["sizes_flat"]),
             helper.make_node("Equal", ["sizes_flat", "minus_ones"], ["keep"]),
             helper.make_node("Where", ["keep", "ones", "sizes_flat"], ["target"]),
             helper.make_node("Expand", ["type_slice", "target"], ["type_ids"]),
             helper.make_node("Gather", ["table", "ids"], ["te"], axis=0),
             helper.make_node("Gather", ["table", "type_ids"], ["tt"], axis=0),
             helper.make_node("Gather", ["table", "positions"], ["pe"], axis=0),
             helper.make_node("Add", ["te", "tt"], ["sum"]), helper.make_node("Add", ["sum", "pe"], ["y"])]
    return make_model(nodes, [vinfo("ids", TensorProto.INT64, ["n", "s"])], [vinfo("y", shape=[None, None, None])],
                      [tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
                       tensor("axes", np.array([0], np.int64)), tensor("axis1", np.array([1], np.int64)),
                       tensor("start", np.array([start], np.int64)), tensor("step", np.array([1], np.int64)),
                       tensor("type_start", np.array([0], np.int64)),
                       tensor("minus_one", np.array([-1], np.int64)),
                       tensor("minus_ones", np.array([-1, -1], np.int64)),
                       tensor("ones", np.array([1, 1], np.int64)),
                       tensor("buffer", np.arange(16, dtype=np.int64).reshape(1, 16)),
                       tensor("types", np.zeros((1, 16), np.int64)), tensor("table", np.zeros((16, 8), np.float32))])


def test_a_slice_of_a_buffer_to_the_sequence_is_named_and_so_is_what_it_is_added_to(tmp_path):
    """``buffer[:, :s]`` is min(s, 16) long; broadcast with s it can only be s (were it 16 < s, the Add would fail
    unless 16 were 1), so the token types expanded to (n, s) and the embeddings' sum keep the model's names."""
    loaded = typed(_bert_embeddings(), tmp_path)
    assert loaded.graph.value("positions").shape == (1, "min(s,16)")
    assert loaded.graph.value("type_ids").shape == ("n", "s")
    assert loaded.graph.value("sum").shape == ("n", "s", 8)
    assert loaded.graph.outputs[0].shape == ("n", "s", 8)


@pytest.mark.parametrize("end_source, start", [("n", 0), ("s", 1)])
def test_a_slice_not_from_the_start_or_to_another_dim_is_not_the_sequence(tmp_path, end_source, start):
    """Sliced to the batch size, or from 1: the sum broadcasts s with another length, which is not s."""
    loaded = typed(_bert_embeddings(end_source, start), tmp_path)
    assert loaded.graph.value("sum").shape == ("n", "s", 8)  # the types' slice is still from 0 to s
    assert loaded.graph.outputs[0].shape[1] != "s"


@pytest.mark.parametrize("condition, declared", [([False, True], ("n", "s")), ([False, False], None)])
def test_an_expand_to_a_target_picked_by_a_folded_where_is_declared(tmp_path, condition, declared):
    """BART's ``positions.expand(batch, -1)``: Expand(Range(0, s, 1), Where(c, 1, [n, -1])) with the Equal that
    was c folded; the target is [n, 1] and the positions (n, s). A condition that keeps the -1 is no target."""
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Range", ["zero", "s", "one"], ["positions"]),
             helper.make_node("Concat", ["n1", "minus_one"], ["sizes"], axis=0),
             helper.make_node("Where", ["keep", "ones", "sizes"], ["target"]),
             helper.make_node("Expand", ["positions", "target"], ["y"])]
    model = make_model(nodes, [vinfo("ids", TensorProto.INT64, ["n", "s"])],
                       [vinfo("y", TensorProto.INT64, [None, None])],
                       [tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
                        tensor("axes", np.array([0], np.int64)), tensor("minus_one", np.array([-1], np.int64)),
                        tensor("ones", np.array([1, 1], np.int64)), tensor("keep", np.array(condition))])
    loaded = typed(model, tmp_path)
    shape = loaded.graph.outputs[0].shape
    if declared:
        assert shape == declared
    else:
        assert shape != ("n", "s")


@pytest.mark.parametrize("target, declared", [([0, -1, 4, 16], ("n", "s", 4, 16)), ([-1, 64], ("n*s", 64)),
                                              ([0, -1, 16], ("n", "4*s", 16)), ([0, 0, 2, -1], ("n", "s", 2, 32)),
                                              ([0, -1, 48], None), ([-1, 2, 0], None)])
def test_a_reshape_whose_minus_one_cancels_to_a_name_is_declared(tmp_path, target, declared):
    """view(b, -1, heads, d) of a (b, s, heads * d) projection: the -1 is s, which onnx's inference (no
    arithmetic on names) makes up; where it is s * 4 or n * s it is named as torch's exporter names such a
    product; where the input's numbers are not a multiple of the target's (64 / 48, or 64 / (2 x 64) with the 0
    copying the 64) it stays open."""
    nodes = [helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", "s", 64])], [vinfo("y", shape=[None] * len(target))],
                       [tensor("target", np.array(target, np.int64))])
    loaded = typed(model, tmp_path)
    shape = loaded.graph.outputs[0].shape
    if declared:
        assert shape == declared
    else:
        assert any(isinstance(d, str) and d.startswith("unk__") for d in shape), shape


@pytest.mark.parametrize("mask, declared", [(["batch", 1, "seq", "seq"], ("batch", 4, "seq", 8)),
                                            ([3, 1, "seq", "seq"], None)])
def test_a_domain_attention_output_is_declared_from_what_its_inputs_prove(tmp_path, mask, declared):
    """The queries come from an op onnx cannot infer, typed by an earlier round (as names kept across onnx's
    runs are): onnx's run sees no shape for them, so the attention's output is declared from the IR's types (the
    queries' shape, the values' last dim), unless the mask may enlarge the scores (a batch of 3 would)."""
    import worker.engine.mirserve_domain.fused  # noqa: F401  (defines the mirserve attention ops)

    nodes = [helper.make_node("Mystery", ["x"], ["q"], domain="com.example"),
             helper.make_node("ScaledDotProductAttention", ["q", "kt", "v", "mask"], ["y"], domain="mirserve",
                              scale=0.25),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [vinfo("x", shape=["batch", 4, "seq", 8]),
                                           vinfo("kt", shape=["batch", 4, 8, "seq"]),
                                           vinfo("v", shape=["batch", 4, "seq", 8]), vinfo("mask", shape=mask)],
                              [vinfo("z", shape=[None] * 4)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mirserve", 1),
                                                    helper.make_opsetid("com.example", 1)])
    proto.ir_version = 10
    onnx.save(proto, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    queries = loaded.graph.value("q")
    queries.dtype, queries.shape = TensorProto.FLOAT, ("batch", 4, "seq", 8)
    infer(loaded)
    assert loaded.graph.value("y").shape == declared
    if declared is not None:  # and what reads it gets the names
        assert loaded.graph.outputs[0].shape == declared


def test_a_product_of_a_name_keeps_its_name_through_the_heads_of_a_sequence_first_attention(tmp_path):
    """nn.MultiheadAttention at a dynamic batch (sequence first): view(5, -1, 64) of (5, n, 768) is
    (5, 12*n, 64); transposed and viewed as (-1, 12, 5, 64) it is (n, 12, 5, 64) again, so what reads it (the
    attention fusions) sees the batch of the queries, keys and values as one dim."""
    nodes = [helper.make_node("Reshape", ["x", "heads"], ["h"]),
             helper.make_node("Transpose", ["h"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "split"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[5, "n", 768])], [vinfo("y", shape=[None] * 4)],
                       [tensor("heads", np.array([5, -1, 64], np.int64)),
                        tensor("split", np.array([-1, 12, 5, 64], np.int64))])
    loaded = typed(model, tmp_path)
    assert loaded.graph.value("h").shape == (5, "12*n", 64)
    assert loaded.graph.value("t").shape == ("12*n", 5, 64)
    assert loaded.graph.outputs[0].shape == ("n", 12, 5, 64)


def test_names_carry_through_a_deep_chain_of_declarations_in_one_inference(tmp_path):
    """Eight sequence-first head splits and joins in a row: each Reshape is named only once what it reshapes
    is, 24 declarations one after the other. Every value ends named (none ``unk__``), as a deep model's last
    layers need for their attentions to fuse, without a run of onnx's inference per link."""
    nodes, inits, source = [], [], "x"
    for layer in range(8):
        nodes += [helper.make_node("Reshape", [source, "heads"], [f"h{layer}"]),
                  helper.make_node("Transpose", [f"h{layer}"], [f"t{layer}"], perm=[1, 0, 2]),
                  helper.make_node("Reshape", [f"t{layer}", "split"], [f"s{layer}"]),
                  helper.make_node("Transpose", [f"s{layer}"], [f"u{layer}"], perm=[2, 0, 1, 3]),
                  helper.make_node("Reshape", [f"u{layer}", "join"], [f"j{layer}"])]
        source = f"j{layer}"
    nodes.append(helper.make_node("Relu", [source], ["y"]))
    model = make_model(nodes, [vinfo("x", shape=[5, "n", 768])], [vinfo("y", shape=[None] * 3)],
                       [tensor("heads", np.array([5, -1, 64], np.int64)),
                        tensor("split", np.array([-1, 12, 5, 64], np.int64)),
                        tensor("join", np.array([5, -1, 768], np.int64))])
    loaded = typed(model, tmp_path)
    made_up = [v.name for v in loaded.graph.values() if v.shape and any(isinstance(d, str) and d.startswith("unk__")
                                                                        for d in v.shape)]
    assert made_up == []
    assert loaded.graph.value("s7").shape == ("n", 12, 5, 64) and loaded.graph.outputs[0].shape == (5, "n", 768)
