"""eliminate_shape_op: shape computations become constants where the dims they read are known; partly known
shapes keep working for every value of their symbolic dims."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import compare, run

STEP = ["eliminate_shape_op"]


def test_tail_of_a_partly_symbolic_shape_becomes_a_constant(tmp_path):
    # y = Reshape(x2, Concat([-1], Shape(x)[1:])): only the batch is symbolic
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "one", "big"], ["tail"]),
             helper.make_node("Concat", ["minus", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["x2", "target"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", 3, 4]), vinfo("x2", shape=["n", 12])],
                       [vinfo("y", shape=["n", 3, 4])],
                       [tensor("one", np.array([1], np.int64)), tensor("big", np.array([2**62], np.int64)),
                        tensor("minus", np.array([-1], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Reshape"]
    np.testing.assert_array_equal(outcome.model.graph.initializers["target"].const, [-1, 3, 4])
    for n in (1, 5):  # still right for any batch
        feeds = {"x": np.zeros((n, 3, 4), np.float32), "x2": np.arange(n * 12, dtype=np.float32).reshape(n, 12)}
        compare(outcome.before, outcome.after, feeds=feeds)


def batch_reshape_model(shape_of="x", other_batch="n", allowzero=0, tail=(12,), x_shape=("n", 3, 4)):
    """y = Reshape(x, Concat(Unsqueeze(Shape(<shape_of>)[0]), tail)): the batch is symbolic (x2's is named
    ``other_batch``); ``allowzero`` as the dynamo exporter writes it (1)."""
    nodes = [helper.make_node("Shape", [shape_of], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["n1", "twelve"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], allowzero=allowzero),
             helper.make_node("Relu", ["y"], ["r"]), helper.make_node("Neg", ["r"], ["z"])]
    return make_model(nodes, [vinfo("x", shape=list(x_shape)), vinfo("x2", shape=[other_batch, 5])],
                      [vinfo("z", shape=["n", *([None] * len(tail))])],
                      [tensor("zero", np.array(0, np.int64)), tensor("zero1", np.array([0], np.int64)),
                       tensor("twelve", np.array(tail, np.int64))], opset=14)


def test_one_unknown_element_of_a_reshape_becomes_minus_one(tmp_path):
    """x2's batch has another name: it need not be x's, but it is the one dim the shape does not know, so the
    element count fixes it (the view(batch, heads, s, d) of a (batch * heads, s, d) value with a dynamic batch:
    torchvision's ViT exported with dynamic axes)."""
    outcome = run(batch_reshape_model(shape_of="x2", other_batch="m"), STEP, tmp_path)
    assert outcome.ops == ["Reshape", "Relu", "Neg"]
    np.testing.assert_array_equal(outcome.model.graph.nodes_of_type("Reshape")[0].input(1).const, [-1, 12])
    for n in (1, 3):  # the input model runs only where x2's batch is x's
        feeds = {"x": np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4) - 5, "x2": np.zeros((n, 5), np.float32)}
        compare(outcome.before, outcome.after, feeds=feeds)


def test_two_unknown_elements_keep_their_computation(tmp_path):
    # Reshape(x [n, 12], [m, k, 12]): two dims of another value, nothing fixes either
    nodes = [helper.make_node("Shape", ["x2"], ["s"]), helper.make_node("Concat", ["s", "twelve"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", 12]), vinfo("x2", shape=["m", "k"])],
                       [vinfo("y", shape=["m", "k", 12])], [tensor("twelve", np.array([12], np.int64))])
    outcome = run(model, STEP, tmp_path, typed=False)
    assert outcome.ops == ["Shape", "Concat", "Reshape"]


def test_a_dim_of_another_value_with_the_same_name_is_copied_from_the_input(tmp_path):
    """view(x2.size(0), 12) of x: x2's batch is named as x's (one symbolic dim of the model), so the shape
    is the constant [0, 12], as a transformer export's view(h.size(0), h.size(1), -1, 48) of a projection of h."""
    outcome = run(batch_reshape_model(shape_of="x2"), STEP, tmp_path)
    assert outcome.ops == ["Reshape", "Relu", "Neg"]
    np.testing.assert_array_equal(outcome.model.graph.nodes_of_type("Reshape")[0].input(1).const, [0, 12])
    for n in (1, 3):
        feeds = {"x": np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4) - 5, "x2": np.zeros((n, 5), np.float32)}
        compare(outcome.before, outcome.after, feeds=feeds)


def test_a_reshape_copying_dims_of_its_own_input_gets_a_constant_shape(tmp_path):
    outcome = run(batch_reshape_model(), STEP, tmp_path)  # typed: what follows the Reshape is inferred again
    assert outcome.ops == ["Reshape", "Relu", "Neg"]
    reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
    np.testing.assert_array_equal(reshape.input(1).const, [0, 12])
    assert reshape.output(0).shape == ("n", 12)
    assert outcome.model.graph.nodes_of_type("Relu")[0].output(0).shape == ("n", 12)
    for n in (1, 3):
        feeds = {"x": np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4) - 5, "x2": np.zeros((n, 5), np.float32)}
        compare(outcome.before, outcome.after, feeds=feeds)


@pytest.mark.parametrize("tail", [(12,), (-1, 4)])
def test_an_allowzero_reshape_copying_its_own_dims_gets_a_constant_shape_and_copies(tmp_path, tail):
    """The dynamo exporter sets allowzero on every Reshape: a 0 is then a 0, so the copied batch cannot be 0 as
    it stands; with no 0 in the target, allowzero off reads the same (a batch of 0 is copied as 0)."""
    outcome = run(batch_reshape_model(allowzero=1, tail=tail), STEP, tmp_path)
    assert outcome.ops == ["Reshape", "Relu", "Neg"]
    reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
    np.testing.assert_array_equal(reshape.input(1).const, [0, *tail])
    assert reshape.attr("allowzero", 0) == 0
    for n in (1, 3):
        feeds = {"x": np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4) - 5, "x2": np.zeros((n, 5), np.float32)}
        compare(outcome.before, outcome.after, feeds=feeds)


@pytest.mark.parametrize("kwargs", [{"tail": (0, 12), "x_shape": ("n", 0, 4)},
                                    {"shape_of": "x2", "other_batch": "m"}])
def test_an_allowzero_reshape_with_a_zero_or_an_unknown_dim_keeps_its_computation(tmp_path, kwargs):
    """A constant 0 means an empty dim under allowzero; x2's batch (another name) is no copy, and -1 for it would
    not be what allowzero reads where that batch is 0."""
    import onnx

    from worker.engine.inference import infer_types
    from worker.engine.ir import load_model
    from worker.engine.passes.fold.eliminate_shape_op import _copying_shape, track

    onnx.save(batch_reshape_model(allowzero=1, **kwargs), str(tmp_path / "m.onnx"))
    model = load_model(tmp_path / "m.onnx")
    infer_types(model)
    [reshape] = model.graph.nodes_of_type("Reshape")
    assert _copying_shape(reshape, track(model.graph, 14)) is None


def test_a_dim_copied_to_another_position_is_not_a_copy(tmp_path):
    # Reshape(x [n, 3, 4], [12, n]) moves the batch: 0 there would copy dim 1, not the batch
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "zero1", "one"], ["n1"]),
             helper.make_node("Concat", ["twelve", "n1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", 3, 4])], [vinfo("y", shape=[12, "n"])],
                       [tensor("zero1", np.array([0], np.int64)), tensor("one", np.array([1], np.int64)),
                        tensor("twelve", np.array([12], np.int64))])
    outcome = run(model, STEP, tmp_path)
    # nor a dim the shape does not know: the element count fixes it, as -1
    assert outcome.ops == ["Reshape"]
    np.testing.assert_array_equal(outcome.model.graph.nodes_of_type("Reshape")[0].input(1).const, [12, -1])
    for n in (1, 3):
        compare(outcome.before, outcome.after, feeds={"x": np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4)})


def test_static_shape_arithmetic_folds_entirely(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i2"], ["h"], axis=0),
             helper.make_node("Gather", ["s", "i3"], ["w"], axis=0), helper.make_node("Mul", ["h", "w"], ["hw"]),
             helper.make_node("Cast", ["hw"], ["hw32"], to=TensorProto.INT32),
             helper.make_node("Cast", ["hw32"], ["hw64"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["hw64", "axes"], ["hw1"]),
             helper.make_node("Concat", ["i0", "c", "hw1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", 2, 3, 4])], [vinfo("y", shape=[None, 2, 12])],
                       [tensor("i2", np.array(2, np.int64)), tensor("i3", np.array(3, np.int64)),
                        tensor("axes", np.array([0], np.int64)), tensor("i0", np.array([0], np.int64)),
                        tensor("c", np.array([2], np.int64))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Reshape"]
    np.testing.assert_array_equal(outcome.model.graph.initializers["target"].const, [0, 2, 12])


@pytest.mark.parametrize("opset", [9, 15])
def test_slice_attributes_and_shape_start_end(tmp_path, opset):
    if opset < 10:
        nodes = [helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("Slice", ["s"], ["tail"], starts=[1], ends=[3], axes=[0])]
    else:
        nodes = [helper.make_node("Shape", ["x"], ["tail"], start=1, end=3)]
    nodes += [helper.make_node("Concat", ["minus", "tail"], ["target"], axis=0),
              helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=["n", 3, 4])], [vinfo("y", shape=[None, 3, 4])],
                       [tensor("minus", np.array([-1], np.int64))], opset=opset)
    outcome = run(model, STEP, tmp_path, shapes={"x": [2, 3, 4]})
    assert outcome.ops == ["Reshape"]


def test_a_shape_that_is_a_graph_output_stays(tmp_path):
    model = make_model([helper.make_node("Shape", ["x"], ["y"])], [vinfo("x", shape=[2, 3])],
                       [vinfo("y", TensorProto.INT64, [2])])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Shape"]


def expand_mask_model(mask_batch="n", folded_condition=False):
    """TorchScript's ``mask.expand(ids.size(0), -1, ids.size(1), ids.size(1))``: Expand(mask, Where(Equal(v, -1),
    1, v)) with v = [n, -1, s, s] read off ids (n, s); the mask is (``mask_batch``, 1, s, s). With
    ``folded_condition`` the Equal is a constant already (an earlier fold knew it), as RoBERTa's export has it."""
    dims = [("d0", "zero"), ("d1", "one"), ("d2", "one")]
    nodes = [helper.make_node("Shape", ["ids"], ["s"])]
    for name, index in dims:
        nodes += [helper.make_node("Gather", ["s", index], [name], axis=0),
                  helper.make_node("Unsqueeze", [name, "axis0"], [f"{name}u"])]
    nodes += [helper.make_node("Concat", ["d0u", "minus", "d1u", "d2u"], ["v"], axis=0),
              helper.make_node("Where", ["is_minus", "ones", "v"], ["target"]),
              helper.make_node("Expand", ["mask", "target"], ["y"])]
    constants = [tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
                 tensor("axis0", np.array([0], np.int64)), tensor("minus", np.array([-1], np.int64)),
                 tensor("ones", np.ones(4, np.int64))]
    if folded_condition:
        constants.append(tensor("is_minus", np.array([False, True, False, False])))
    else:
        nodes.insert(-2, helper.make_node("Equal", ["v", "minus"], ["is_minus"]))
    return make_model(nodes, [vinfo("ids", TensorProto.INT64, ["n", "s"]),
                              vinfo("mask", shape=[mask_batch, 1, "s", "s"])],
                      [vinfo("y", shape=[None, None, None, None])], constants)


@pytest.mark.parametrize("folded_condition", [False, True])
def test_an_expand_to_dims_of_its_own_input_gets_a_constant_target_of_ones(tmp_path, folded_condition):
    """No dim is -1, so Equal(v, -1) is known where v holds dims; the Where is v with 1 for the -1; each of the
    target's dims is the mask's own (by name), so 1 broadcasts to it: the target is [1, 1, 1, 1] and the output
    keeps the names (batch, sequence) instead of four made-up ones. A condition folded already (a boolean
    constant) is read as the Equal would be."""
    outcome = run(expand_mask_model(folded_condition=folded_condition), STEP, tmp_path)
    assert outcome.ops == ["Expand"]
    expand = outcome.model.graph.nodes_of_type("Expand")[0]
    np.testing.assert_array_equal(expand.input(1).const, [1, 1, 1, 1])
    assert expand.output(0).shape == ("n", 1, "s", "s")
    for n, s in ((1, 3), (2, 5)):
        feeds = {"ids": np.zeros((n, s), np.int64), "mask": np.arange(n * s * s, dtype=np.float32).reshape(n, 1, s, s)}
        compare(outcome.before, outcome.after, feeds=feeds)


def test_an_expand_that_may_broadcast_its_input_keeps_its_target_computation(tmp_path):
    # the mask's batch is 1: ids' batch n enlarges it, which a 1 in the target would not
    outcome = run(expand_mask_model(mask_batch=1), STEP, tmp_path, typed=False)
    assert "Where" in outcome.ops and "Shape" in outcome.ops
    for n in (1, 3):
        feeds = {"ids": np.zeros((n, 4), np.int64), "mask": np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)}
        compare(outcome.before, outcome.after, feeds=feeds)


def test_a_folded_condition_read_as_an_expand_target_leaves_the_types_to_be_inferred_again(tmp_path):
    """ViT's ``cls_token.expand(x.size(0), -1, -1)``: Expand(cls, Where(Equal(v, -1), 1, v)), v = [n, -1, -1].
    Once the Equal is a constant, inference reads the target as [n, 1, 1] (``inference.dims_vector``), so the
    pass leaves the types stale: the class token and the patches joined after it keep the batch's name."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus", "minus"], ["v"], axis=0),
             helper.make_node("Equal", ["v", "minus"], ["is_minus"]),
             helper.make_node("Where", ["is_minus", "ones", "v"], ["target"]),
             helper.make_node("Expand", ["cls", "target"], ["tokens"]),
             helper.make_node("Concat", ["tokens", "x"], ["y"], axis=1)]
    model = make_model(nodes, [vinfo("x", shape=["n", 4, 8])], [vinfo("y", shape=[None, None, None])],
                       [tensor("zero", np.array(0, np.int64)), tensor("axis0", np.array([0], np.int64)),
                        tensor("minus", np.array([-1], np.int64)), tensor("ones", np.ones(3, np.int64)),
                        tensor("cls", np.arange(8, dtype=np.float32).reshape(1, 1, 8))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.model.graph.outputs[0].shape == ("n", 5, 8)
    for n in (1, 3):
        compare(outcome.before, outcome.after, feeds={"x": np.ones((n, 4, 8), np.float32)})


def projected_heads_model(carry: str = "MatMul"):
    """A dynamic TorchScript export's head split: h = x + y (two inputs whose dims have different names, so
    inference names h's dims ``unk__N``), q = h @ W (or another op between h and the Reshape), and
    Reshape(q, Concat(Shape(h)[0], Shape(h)[1], 2, 4)), the view(h.size(0), h.size(1), heads, size) of BERT's
    attention."""
    nodes = [helper.make_node("Add", ["x", "y"], ["h"]), helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "one"], ["t"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Unsqueeze", ["t", "zero1"], ["t1"]),
             helper.make_node("Concat", ["n1", "t1", "heads"], ["target"], axis=0)]
    if carry == "MatMul":
        nodes.append(helper.make_node("MatMul", ["h", "w"], ["q"]))
    elif carry == "Transpose":  # (b, s, 8) -> (s, b, 8): the batch is no longer at position 0
        nodes.append(helper.make_node("Transpose", ["h"], ["q"], perm=[1, 0, 2]))
    else:  # broadcasting against a value whose leading dims are not 1
        nodes.append(helper.make_node("Add", ["h", "x"], ["q"]))
    nodes += [helper.make_node("Reshape", ["q", "target"], ["r"]),
              helper.make_node("Transpose", ["r"], ["out"], perm=[0, 2, 1, 3])]
    return make_model(nodes, [vinfo("x", shape=["b", "s", 8]), vinfo("y", shape=["b2", "s2", 8])],
                      [vinfo("out", shape=[None, None, None, None])],
                      [tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
                       tensor("zero1", np.array([0], np.int64)), tensor("heads", np.array([2, 4], np.int64)),
                       tensor("w", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))])


def test_a_dim_carried_through_a_projection_is_copied_even_unnamed(tmp_path):
    """Shape(h)[0:2] read for a Reshape of h @ W: the dims are h's whatever inference called them, so the shape is
    the constant [0, 0, 2, 4] and the heads come out typed (what attention fusion needs)."""
    outcome = run(projected_heads_model(), STEP, tmp_path)
    reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
    np.testing.assert_array_equal(reshape.input(1).const, [0, 0, 2, 4])
    assert reshape.output(0).shape[2:] == (2, 4)
    assert "Shape" not in outcome.ops
    for b, s in ((1, 3), (2, 5)):
        rng = np.random.default_rng(b)
        feeds = {"x": rng.standard_normal((b, s, 8)).astype(np.float32),
                 "y": rng.standard_normal((b, s, 8)).astype(np.float32)}
        compare(outcome.before, outcome.after, feeds=feeds)


@pytest.mark.parametrize("carry", ["Transpose", "Add"])
def test_a_dim_not_carried_to_its_position_is_not_copied(tmp_path, carry):
    """A Transpose moves h's batch elsewhere, an Add with a full-size operand need not keep it: neither dim
    is the Reshape input's own, so no 0 (and with two such dims, no -1 either): the computation stays."""
    outcome = run(projected_heads_model(carry), STEP, tmp_path)
    reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
    assert reshape.input(1).const is None or 0 not in list(reshape.input(1).const)


def test_the_heads_joined_after_attention_get_a_constant_shape(tmp_path):
    """The join back of BERT's heads, view(h.size(0), h.size(1), -1) of Transpose(Attention(q, k, v)) where
    q = Transpose(Reshape(h @ W, [0, 0, 2, 4])): the batch and sequence were carried from h through the
    projection, the copying Reshape, both Transposes and the attention (its output has q's dims but the last),
    so the join becomes Reshape([0, 0, -1])."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Add", ["x", "y"], ["h"]), helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "one"], ["t"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Unsqueeze", ["t", "zero1"], ["t1"]),
             helper.make_node("Concat", ["n1", "t1", "minus"], ["target"], axis=0)]
    for w in "qkv":
        nodes += [helper.make_node("MatMul", ["h", f"w{w}"], [f"{w}3"]),
                  helper.make_node("Reshape", [f"{w}3", "split"], [f"{w}4"]),
                  helper.make_node("Transpose", [f"{w}4"], [w], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Attention", ["q", "k", "v"], ["a"]),
              helper.make_node("Transpose", ["a"], ["a4"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["a4", "target"], ["out"])]
    weights = [tensor(f"w{w}", rng.standard_normal((8, 8)).astype(np.float32)) for w in "qkv"]
    model = make_model(nodes, [vinfo("x", shape=["b", "s", 8]), vinfo("y", shape=["b2", "s2", 8])],
                       [vinfo("out", shape=[None, None, None])],
                       [tensor("zero", np.array(0, np.int64)), tensor("one", np.array(1, np.int64)),
                        tensor("zero1", np.array([0], np.int64)), tensor("minus", np.array([-1], np.int64)),
                        tensor("split", np.array([0, 0, 2, 4], np.int64)), *weights], opset=23)
    outcome = run(model, STEP, tmp_path)
    join = outcome.model.graph.nodes_of_type("Reshape")[-1]
    np.testing.assert_array_equal(join.input(1).const, [0, 0, -1])
    assert "Shape" not in outcome.ops
    for b, s in ((1, 3), (2, 5)):
        feeds = {"x": rng.standard_normal((b, s, 8)).astype(np.float32),
                 "y": rng.standard_normal((b, s, 8)).astype(np.float32)}
        compare(outcome.before, outcome.after, feeds=feeds)


def test_a_computed_dim_named_as_the_inputs_is_copied_under_allowzero(tmp_path):
    """The dynamo exporter's view(batch, seq, -1, 16) with allowzero 1, where seq is arithmetic on the input's
    size ((samples // 20) - 1: no Shape of the value reshaped) and the exporter named the Reshape's input and
    output dims alike: the shape becomes [0, 0, -1, 4] with allowzero 0 (still right for every size)."""
    nodes = [helper.make_node("Shape", ["audio"], ["sa"]),
             helper.make_node("Gather", ["sa", "one"], ["samples"], axis=0),
             helper.make_node("Div", ["samples", "twenty"], ["d"]), helper.make_node("Sub", ["d", "one"], ["seq"]),
             helper.make_node("Reshape", ["seq", "one1"], ["seq1"]),  # as dynamo writes it: not tracked
             helper.make_node("Shape", ["h"], ["b1"], start=0, end=1),
             helper.make_node("Concat", ["b1", "seq1", "minus", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["h", "target"], ["y"], allowzero=1)]
    named = "((samples//20)) - 1"
    model = make_model(nodes, [vinfo("audio", shape=["batch", "samples"]), vinfo("h", shape=["batch", named, 8])],
                       [vinfo("y", shape=["batch", named, 2, 4])],
                       [tensor("one", np.array(1, np.int64)), tensor("twenty", np.array(20, np.int64)),
                        tensor("zero1", np.array([0], np.int64)), tensor("minus", np.array([-1], np.int64)),
                        tensor("four", np.array([4], np.int64)), tensor("one1", np.array([1], np.int64))], opset=18)
    outcome = run(model, STEP, tmp_path, check=False)  # at 1 sample the input model itself asks for -1 twice
    reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
    np.testing.assert_array_equal(reshape.input(1).const, [0, 0, -1, 4])
    assert not reshape.attr("allowzero", 0)
    assert outcome.ops == ["Reshape"]
    for b, samples in ((1, 100), (2, 200)):
        seq = samples // 20 - 1
        feeds = {"audio": np.zeros((b, samples), np.float32),
                 "h": np.arange(b * seq * 8, dtype=np.float32).reshape(b, seq, 8)}
        compare(outcome.before, outcome.after, feeds=feeds)


def test_an_allowzero_shape_asking_for_an_empty_dim_keeps_its_computation(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["n1", "zero1", "twelve"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], allowzero=1)]
    model = make_model(nodes, [vinfo("x", shape=["n", 0, 12])], [vinfo("y", shape=["n", 0, 12])],
                       [tensor("zero", np.array(0, np.int64)), tensor("zero1", np.array([0], np.int64)),
                        tensor("twelve", np.array([12], np.int64))], opset=18)
    outcome = run(model, STEP, tmp_path, check=False)
    reshape = outcome.model.graph.nodes_of_type("Reshape")[0]
    assert reshape.attr("allowzero", 0) == 1
    assert reshape.input(1).const is None or list(reshape.input(1).const) != [0, 0, 12]
