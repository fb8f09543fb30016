"""constant_folding: constant subgraphs are computed (numpy, then onnxruntime); large generated tensors only
when they become weights; random ops, Q/DQ, subgraphs and graph outputs never."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_model, tensor, vinfo
from tests.engine.passes.fold.harness import body_of, both_conditions, if_model, run
from worker.engine import evaluate as evaluate_module
from worker.engine.limits import LimitError, Limits
from worker.engine.passes.support.arrays import is_uniform

STEP = ["constant_folding"]


def test_a_constant_chain_folds_into_named_initializers(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("Mul", ["wt", "two"], ["w2"]), helper.make_node("MatMul", ["x", "w2"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 4])],
                       [tensor("w", w), tensor("two", np.float32(2))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["MatMul"]
    np.testing.assert_array_equal(outcome.model.graph.initializers["w2"].const, w.T * 2)
    assert [d["from"] for d in outcome.details("constant_folding")] == [["transpose"], ["mul"]]


def test_ops_without_a_numpy_kernel_run_on_onnxruntime(tmp_path, monkeypatch):
    calls = []
    original = evaluate_module._onnxruntime

    def recording(node, inputs, opset):
        calls.append(node.op_type)
        return original(node, inputs, opset)

    monkeypatch.setattr(evaluate_module, "_onnxruntime", recording)
    nodes = [helper.make_node("Softmax", ["k"], ["s"], axis=-1), helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["x", "e"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])],
                       [tensor("k", np.array([[0.5, 1, 2], [3, 2, 1]], np.float32))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Add"] and calls == ["Softmax", "Erf"]


def generated(op, out_shape, reader="Add"):
    """A generator op making ``out_shape`` from small inputs, read by ``reader`` (Add data, or Conv weight)."""
    shape = np.array(out_shape, np.int64)
    makers = {
        "ConstantOfShape": ([helper.make_node("ConstantOfShape", ["shape"], ["g"],
                                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5]))],
                            [tensor("shape", shape)]),
        "Expand": ([helper.make_node("Expand", ["one", "shape"], ["g"])],
                   [tensor("one", np.full([1] * len(out_shape), 0.5, np.float32)), tensor("shape", shape)]),
        "Tile": ([helper.make_node("Tile", ["one", "shape"], ["g"])],
                 [tensor("one", np.full([1] * len(out_shape), 0.5, np.float32)), tensor("shape", shape)]),
    }
    nodes, initializers = makers[op]
    if reader == "Add":
        nodes = nodes + [helper.make_node("Add", ["x", "g"], ["y"])]
        return make_model(nodes, [vinfo("x", shape=list(out_shape))], [vinfo("y", shape=list(out_shape))],
                          initializers)
    nodes = nodes + [helper.make_node("Conv", ["x", "g"], ["y"])]
    return make_model(nodes, [vinfo("x", shape=[1, out_shape[1], 3, 3])], [vinfo("y", shape=[1, out_shape[0], 1, 1])],
                      initializers)


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Tile"])
def test_a_large_generated_tensor_read_as_data_is_not_folded(tmp_path, op):
    outcome = run(generated(op, [256, 256]), STEP, tmp_path)
    assert op in outcome.ops
    assert outcome.refused("constant_folding", "above the 64 KiB limit) that no weight input reads")


def test_a_small_generated_tensor_is_folded(tmp_path):
    outcome = run(generated("Expand", [4, 8]), STEP, tmp_path)
    assert outcome.ops == ["Add"]


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Tile"])
def test_a_large_generated_weight_is_folded_as_a_view(tmp_path, op):
    outcome = run(generated(op, [256, 64, 3, 3], reader="Conv"), STEP, tmp_path)
    assert outcome.ops == ["Conv"]
    weight = outcome.model.graph.nodes_of_type("Conv")[0].input(1).const
    assert weight.shape == (256, 64, 3, 3) and is_uniform(weight) and weight.strides == (0, 0, 0, 0)


def test_a_weight_generated_through_view_and_elementwise_ops_stays_a_view(tmp_path):
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["g"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("Unsqueeze", ["g", "axes"], ["u"]), helper.make_node("Mul", ["u", "two"], ["m"]),
             helper.make_node("Conv", ["x", "m"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[1, 64, 3, 3])], [vinfo("y", shape=[1, 512, 1, 1])],
                       [tensor("shape", np.array([512, 64, 3], np.int64)), tensor("axes", np.array([3], np.int64)),
                        tensor("two", np.float32(2))])
    outcome = run(model, STEP, tmp_path)
    weight = outcome.model.graph.nodes_of_type("Conv")[0].input(1).const
    assert outcome.ops == ["Conv"] and is_uniform(weight) and float(weight[0, 0, 0, 0]) == 1.0


def test_random_ops_are_not_folded(tmp_path):
    nodes = [helper.make_node("RandomUniform", [], ["r"], shape=[2, 3]), helper.make_node("Add", ["x", "r"], ["y"])]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])]), STEP, tmp_path,
                  check=False)
    assert outcome.ops == ["RandomUniform", "Add"]
    assert outcome.refused("constant_folding", "RandomUniform: it is not deterministic")


def test_quantize_and_dequantize_of_constants_are_not_folded(tmp_path):
    nodes = [helper.make_node("QuantizeLinear", ["w", "scale", "zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"]),
             helper.make_node("DequantizeLinear", ["w8", "scale", "zero"], ["dq8"]),
             helper.make_node("Add", ["dq", "dq8"], ["s"]), helper.make_node("Add", ["x", "s"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[4])], [vinfo("y", shape=[4])],
                       [tensor("w", np.array([0.1, 0.2, 0.3, 0.4], np.float32)), tensor("scale", np.float32(0.01)),
                        tensor("zero", np.uint8(0)), tensor("w8", np.array([1, 2, 3, 4], np.uint8))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "Add", "Add"]
    assert outcome.refused("constant_folding", "QuantizeLinear: it is kept so that the model stays quantized")
    assert outcome.refused("constant_folding", "DequantizeLinear: it is kept so that the model stays quantized")



def test_a_dequantized_int32_bias_folds_to_its_float_value_exactly(tmp_path):
    """A quantized model's bias (int32, scale x_scale * w_scale per channel) folds: its float value takes no more
    bytes, and the int8 weight's DequantizeLinear beside it stays."""
    bias = np.array([-70000, 5, 0, 123456], np.int32)
    nodes = [helper.make_node("DequantizeLinear", ["w8", "ws", "wz"], ["w"]),
             helper.make_node("DequantizeLinear", ["b32", "bs"], ["b"], axis=0),
             helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 4])],
                       [tensor("w8", np.arange(12, dtype=np.int8).reshape(4, 3)), tensor("ws", np.float32(0.02)),
                        tensor("wz", np.int8(1)), tensor("b32", bias),
                        tensor("bs", np.array([1e-4, 3e-5, 0.5, 7e-6], np.float32))])
    outcome = run(model, STEP, tmp_path, rtol=0, atol=0)
    assert outcome.ops == ["DequantizeLinear", "Gemm"]
    assert outcome.model.graph.nodes_of_type("DequantizeLinear")[0].input(0).name == "w8"
    folded = outcome.model.graph.nodes_of_type("Gemm")[0].input(2).constant_value()
    assert folded.dtype == np.float32 and folded.tobytes() == (bias.astype(np.float32) * np.array(
        [1e-4, 3e-5, 0.5, 7e-6], np.float32)).tobytes()

def test_a_constant_graph_output_is_not_folded(tmp_path):
    nodes = [helper.make_node("Add", ["a", "a"], ["y"]), helper.make_node("Relu", ["x"], ["z"])]
    model = make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2]), vinfo("z", shape=[2])],
                       [tensor("a", np.ones(2, np.float32))])
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Add", "Relu"] and outcome.refused("constant_folding", "is a graph output")


def test_a_body_node_reading_outer_constants_folds_into_the_main_graph(tmp_path):
    then_nodes = [helper.make_node("Mul", ["k", "k"], ["kk"]), helper.make_node("Add", ["x", "kk"], ["t"])]
    proto = if_model(then_nodes, "t", [helper.make_node("Neg", ["x"], ["e"])], "e",
                     initializers=[tensor("k", np.array([1, 2, 3], np.float32))])
    outcome = both_conditions(proto, STEP, tmp_path)
    assert [n.op_type for n in body_of(outcome)] == ["Add"]
    np.testing.assert_array_equal(outcome.model.graph.initializers["kk"].const, [1, 4, 9])


@pytest.mark.parametrize("opset", [11, 13])
def test_axes_as_attribute_or_input_both_fold(tmp_path, opset):
    if opset >= 13:
        unsqueeze, extra = helper.make_node("Unsqueeze", ["k", "axes"], ["u"]), [tensor("axes", np.array([0], np.int64))]
    else:
        unsqueeze, extra = helper.make_node("Unsqueeze", ["k"], ["u"], axes=[0]), []
    nodes = [unsqueeze, helper.make_node("Add", ["x", "u"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[2, 3])], [vinfo("y", shape=[2, 3])],
                       [tensor("k", np.array([1, 2, 3], np.float32)), *extra], opset=opset)
    outcome = run(model, STEP, tmp_path)
    assert outcome.ops == ["Add"] and outcome.model.graph.initializers["u"].const.shape == (1, 3)


def test_a_fill_beyond_the_folding_budget_is_refused(tmp_path):
    outcome = run(generated("ConstantOfShape", [1024, 64, 3, 3], reader="Conv"), STEP, tmp_path,  # 2.25 MiB
                  limits=Limits(max_folded_mb=1))
    assert outcome.ops == ["ConstantOfShape", "Conv"]
    assert outcome.refused("constant_folding", "would add 2 MiB of constants, beyond what is left of this run's "
                                               "folding budget (1 MiB; limits max_folded_mb and max_output_mb)")


def test_a_fill_beyond_the_output_limit_is_not_folded(tmp_path):
    # 2.25 MiB of weights from a file of a few hundred bytes: within max_folded_mb, beyond the output limit
    outcome = run(generated("ConstantOfShape", [1024, 64, 3, 3], reader="Conv"), STEP, tmp_path,
                  limits=Limits(max_output_mb=1))
    assert outcome.ops == ["ConstantOfShape", "Conv"]
    assert outcome.refused("constant_folding", "beyond what is left of this run's folding budget")


def test_a_hostile_fill_shape_is_refused_before_anything_is_computed(tmp_path):
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["g"]), helper.make_node("MatMul", ["x", "g"], ["y"])]
    model = make_model(nodes, [vinfo("x", shape=[1, "k"])], [vinfo("y", shape=[1, "m"])],
                       [tensor("shape", np.array([2**33, 2**33], np.int64))])
    with pytest.raises(LimitError, match="node 'constantofshape' .ConstantOfShape. would create a tensor of "
                                         "73,786,976,294,838,206,464 elements"):
        run(model, STEP, tmp_path / "default", check=False)  # type inference refuses it
    raised = Limits(max_tensor_elements=2**70, max_tensor_mb=2**60)  # past type inference: folding's own budget
    outcome = run(model, STEP, tmp_path / "raised", check=False, limits=raised)
    assert outcome.ops == ["ConstantOfShape", "MatMul"]
    assert outcome.refused("constant_folding", "beyond what is left of this run's folding budget")


def test_a_fold_that_sizes_what_inference_could_not_types_the_graph_again(tmp_path):
    """swin_t (TorchScript) builds its shifted-window mask from an Expand whose shape type inference could not
    evaluate: folding computed the Expand, but the Unsqueeze after it kept its stale type ('the size of its
    output is not known') and the whole mask computation stayed (655 nodes; 363 now). A fold sizes such a node
    from its constant inputs, and a fold whose value had no inferred shape leaves the types to infer again
    before a pass that needs them (the Shape of what it feeds then folds)."""
    from worker.engine.inference import apply_input_shapes
    from worker.engine.ir import load_model
    from worker.engine.options import OptimizeOptions
    from worker.engine.passes import PassContext, PassManager
    from worker.engine.places import parse_places

    nodes = [helper.make_node("Expand", ["a", "s"], ["e"]), helper.make_node("Unsqueeze", ["e", "axes"], ["u"]),
             helper.make_node("Cast", ["u"], ["uf"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "uf"], ["y"]),
             helper.make_node("Shape", ["y"], ["ys"]), helper.make_node("Cast", ["ys"], ["ysf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["ysf"], ["n"], keepdims=1), helper.make_node("Mul", ["y", "n"], ["z"])]
    model = make_model(nodes, [vinfo("x", shape=[7, 7, 1])], [vinfo("z", shape=[7, 7, 1])],
                       [tensor("a", np.arange(7, dtype=np.int64).reshape(7, 1)),
                        tensor("s", np.array([7, 7], np.int64)), tensor("axes", np.array([-1], np.int64))])
    path = tmp_path / "in.onnx"
    onnx.save(model, path)
    loaded = load_model(path)
    apply_input_shapes(loaded.graph, {})
    ctx = PassContext(loaded, OptimizeOptions(), parse_places())
    PassManager().run(ctx, ["type_inference"])
    for name in ("e", "u", "uf", "y"):  # what inference leaves when it cannot evaluate the Expand's shape
        ctx.graph.value(name).shape = None
    trace = PassManager().run(ctx, ["constant_folding", "eliminate_shape_op"])
    assert [e["pass"] for e in trace] == ["constant_folding", "type_inference", "eliminate_shape_op"]
    assert trace[1]["stale_after"] == "constant_folding"
    assert [n.op_type for n in ctx.graph] == ["Add", "Cast", "ReduceSum", "Mul"]  # Expand, Unsqueeze, Cast, Shape


def test_a_folded_value_that_sizes_an_unknown_shape_has_types_inferred_again(tmp_path, monkeypatch):
    """swin_v2's Pad chain in the default pipeline with type inference held to 6 rounds (fewer than its 12
    links): folding a Pad's pads, which inference had not known, must mark types stale, so that inference
    runs again and the rest of the chain folds. Before, folding kept types valid: 35 nodes of 71 left."""
    from tests.engine.passes.analysis.test_type_inference import pad_chain
    from worker.engine import inference
    from worker.engine.api import optimize
    from worker.engine.options import OptimizeOptions

    monkeypatch.setattr(inference, "MAX_ROUNDS", 6)
    model, height = pad_chain(12)
    onnx.save(model, str(tmp_path / "in.onnx"))
    report = optimize(tmp_path / "in.onnx", tmp_path / "out.onnx", OptimizeOptions())
    assert report["verification"]["passed"] is True
    written = onnx.load(str(tmp_path / "out.onnx"))
    assert [n.op_type for n in written.graph.node] == ["Pad"] * 12
    assert written.graph.output[0].type.tensor_type.shape.dim[2].dim_value == height


@pytest.mark.parametrize("op, attrs", [("NonZero", {}), ("Compress", {"axis": 0}), ("Compress", {})])
def test_ops_sized_by_their_values_fold_on_constants(tmp_path, op, attrs):
    """NonZero and Compress of constants: their output's size follows from the values alone, which type
    inference cannot give (Longformer's sliding-window masks index with NonZero of a constant)."""
    mask = tensor("mask", np.array([1, 0, 1, 1], np.int64))
    reads = ["mask"] if op == "NonZero" else ["data", "keep"]
    nodes = [helper.make_node(op, reads, ["picked"], **attrs), helper.make_node("Cast", ["picked"], ["f"], to=1),
             helper.make_node("ReduceSum", ["f"], ["s"], keepdims=0), helper.make_node("Add", ["x", "s"], ["y"])]
    inits = [mask, tensor("data", np.arange(8, dtype=np.int64).reshape(4, 2)),
             tensor("keep", np.array([True, False, True, True]))]
    outcome = run(make_model(nodes, [vinfo("x", shape=[2])], [vinfo("y", shape=[2])], inits), STEP, tmp_path)
    assert outcome.ops == ["Add"]
