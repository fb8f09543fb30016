"""memory_plan on IR graphs: one rule per test, on small models built with onnx.helper."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from tests.conftest import make_model, save_proto, tensor, vinfo
from tests.engine.memory.plan_checker import check_memory_report
from worker.engine.mirserve_domain.ops import DomainOp, get_op, register_op, unregister_op
from worker.engine.errors import OptionsError
from worker.engine.ir import load_model
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager
from worker.engine.inference import apply_input_shapes
from worker.engine.places import Place, parse_places

FIELDS = {"arenas", "weights_bytes", "io_bytes", "paddle_lite_style_bytes", "macs", "unplanned"}
ARENA_FIELDS = {"space", "naive_bytes", "lower_bound_bytes", "arena_bytes", "ratio", "peak_step", "peak_node",
                "timeline", "values"}


def plan(tmp_path, model: onnx.ModelProto, shapes=None, prepare=None, **options):
    """Run type inference then memory_plan; ``prepare(ir_model)`` may edit the IR in between."""
    ir = load_model(save_proto(model, tmp_path / "model.onnx"))
    apply_input_shapes(ir.graph, shapes or {})
    ctx = PassContext(ir, OptimizeOptions(**options), parse_places())
    manager = PassManager()
    manager.run(ctx, ["type_inference"])
    if prepare is not None:
        prepare(ir)
    manager.run(ctx, ["memory_plan"])
    memory = ctx.report["memory"]
    assert check_memory_report(memory) == []
    return memory, manager.trace[-1]


def arena(memory, space="host"):
    (found,) = [a for a in memory["arenas"] if a["space"] == space]
    return found


def spans(memory, space="host"):
    return {v["name"]: (v["first"], v["last"], v["size"]) for v in arena(memory, space)["values"]}


def test_the_report_has_exactly_the_promised_fields(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["y"])],
                       [vinfo("x", shape=[1, 16])], [vinfo("y", shape=[1, 16])])
    memory, entry = plan(tmp_path, model)
    assert set(memory) == FIELDS
    assert set(arena(memory)) == ARENA_FIELDS
    assert entry["pass"] == "memory_plan" and entry["skipped"] is None


def test_chain_of_elementwise_ops_runs_in_one_buffer(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "bias"], ["a"], name="add"),
             helper.make_node("Softmax", ["a"], ["y"], name="softmax")]
    model = make_model(nodes, [vinfo("x", shape=[1, 3, 8, 8])], [vinfo("y", shape=[1, 4, 8, 8])],
                       [tensor("w", np.ones((4, 3, 1, 1), np.float32)),
                        tensor("bias", np.ones((1, 4, 1, 1), np.float32))])
    memory, entry = plan(tmp_path, model)
    assert spans(memory) == {"c": (0, 3, 1024)}  # c, r and a share one 1 KiB buffer; the bias is broadcast
    assert entry["in_place"] == 2 and entry["buffers"] == 1
    assert arena(memory)["naive_bytes"] == 3 * 1024


def test_in_place_refusals_graph_output_broadcast_and_later_use(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Sigmoid", ["a"], ["s"], name="later_use"),        # a is read again by add
             helper.make_node("Add", ["a", "s"], ["b"], name="add"),              # last use of a and s
             helper.make_node("Mul", ["b", "col"], ["m"], name="broadcast"),    # b [4,1] grows to [4,4]
             helper.make_node("Tanh", ["m"], ["y"], name="to_output")]          # y is a graph output
    model = make_model(nodes, [vinfo("x", shape=[4, 1]), vinfo("col", shape=[1, 4])],
                       [vinfo("y", shape=[4, 4])])
    memory, entry = plan(tmp_path, model)
    # relu may not overwrite the graph input x, nor broadcast overwrite col.
    assert entry["refusals"] == {"in-place write refused: read later": 1,
                                 "in-place write refused: broadcast": 1,
                                 "in-place write refused: graph input": 2,
                                 "in-place write refused: graph output": 1}
    assert spans(memory) == {"a": (0, 3, 64), "s": (1, 2, 64), "m": (3, 4, 64)}  # b lives in a
    assert entry["in_place"] == 1  # add writes over a


def test_views_alias_and_are_not_planned_when_they_view_a_graph_input(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["v"], name="view_of_input"),
             helper.make_node("Relu", ["v"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="view"),
             helper.make_node("Sigmoid", ["f"], ["y"], name="sigmoid")]
    model = make_model(nodes, [vinfo("x", shape=[2, 8])], [vinfo("y", shape=[16, 1])],
                       [tensor("shape", np.array([16, 1], np.int64))])
    memory, entry = plan(tmp_path, model)
    assert spans(memory) == {"r": (1, 3, 64)}
    assert entry["views"] == 1  # f views r; v views x, which lives outside the arena


def test_weights_count_in_stored_precision_and_views_of_weights_add_nothing(tmp_path):
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"], name="make_w",
                              value=helper.make_tensor("v", T.FLOAT, [1], [0.5])),
             helper.make_node("Reshape", ["w", "flat"], ["w_flat"], name="view_w"),
             helper.make_node("Cast", ["h"], ["h32"], name="cast", to=T.FLOAT),
             helper.make_node("Add", ["x", "w_flat"], ["s"], name="add"),
             helper.make_node("Add", ["s", "h32"], ["y"], name="add2")]
    model = make_model(nodes, [vinfo("x", shape=[64])], [vinfo("y", shape=[64])],
                       [tensor("shape", np.array([8, 8], np.int64)), tensor("flat", np.array([64], np.int64)),
                        tensor("h", np.ones(64, np.float16))])
    memory, _ = plan(tmp_path, model)
    # 16 + 8 bytes of int64 shapes, 128 bytes of fp16, 256 bytes of weights made at load; h32 too (256).
    assert memory["weights_bytes"] == {"host": 16 + 8 + 128 + 256 + 256}
    assert memory["io_bytes"] == 2 * 256
    assert spans(memory) == {"s": (3, 4, 256)}


def test_symbolic_dims_leave_the_arena_unplanned_and_name_the_dims(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3, "height", 8])],
                       [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 4, "height", 8])],
                       [tensor("w", np.ones((4, 3, 1, 1), np.float32))])
    memory, entry = plan(tmp_path, model)
    assert memory["arenas"] == [] and entry["unplanned_spaces"] == ["host"]
    dims = sorted(e["dims"][0] for e in memory["unplanned"] if e["kind"] == "symbolic_dims")
    assert dims == ["batch", "height"]
    assert memory["io_bytes"] is None and memory["macs"]["total"] is None  # never a 0 that looks counted
    (entry,) = [e for e in memory["macs"]["unknown"] if e["op"] == "Conv"]
    assert entry["reason"] == "Conv: the shape of its output 0 is [batch, 4, unk__0, 8]"


def test_a_bound_on_a_symbolic_dim_plans_at_the_bound(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3, 8, 8])],
                       [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 4, 8, 8])],
                       [tensor("w", np.ones((4, 3, 1, 1), np.float32))])
    bounded, _ = plan(tmp_path, model, dim_bounds={"batch": 2})
    fixed, _ = plan(tmp_path, model, shapes={"x": [2, 3, 8, 8]})
    assert bounded == fixed
    assert bounded["unplanned"] == []
    assert spans(bounded) == {"c": (0, 1, 2 * 4 * 8 * 8 * 4)}  # Relu may not write over c: y is an output


def nonzero_model() -> onnx.ModelProto:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
             helper.make_node("Transpose", ["nz"], ["idx"], name="transpose"),
             helper.make_node("GatherND", ["x", "idx"], ["g"], name="gather"),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    return make_model(nodes, [vinfo("x", shape=[4, 4])], [helper.make_tensor_value_info("y", T.FLOAT, ["n"])])


def test_a_data_dependent_output_without_a_bound_is_listed_unplanned(tmp_path):
    memory, _ = plan(tmp_path, nonzero_model())
    assert memory["arenas"] == []
    (entry,) = [e for e in memory["unplanned"] if e["kind"] == "data_dependent"]
    assert (entry["value"], entry["node"], entry["op"]) == ("nz", "nonzero", "NonZero")
    assert entry["values"] == ["nz", "idx", "g"] and "--dim-bound nz=N" in entry["reason"]


def test_a_data_dependent_output_with_a_bound_is_planned_at_it(tmp_path):
    memory, _ = plan(tmp_path, nonzero_model(), dim_bounds={"nz": 16})
    # nz: 2 x 16 int64 = 256 bytes; idx the same; g: 16 floats = 64 bytes; the bound follows the dim downstream.
    assert spans(memory) == {"nz": (0, 1, 256), "idx": (1, 2, 256), "g": (2, 3, 64)}
    assert [e["kind"] for e in memory["unplanned"]] == ["io"]  # y keeps the output's own dim name "n"


def test_a_bound_naming_nothing_is_an_options_error(tmp_path):
    with pytest.raises(OptionsError, match="'bogus', which is neither a symbolic dim nor a value") as error:
        plan(tmp_path, nonzero_model(), dim_bounds={"bogus": 3})
    assert error.value.field == "dim_bounds"


@pytest.fixture
def domain_ops():
    """io_copy and FusedConvRelu as the place and fusion passes define them, if they have not yet."""
    added = []
    bodies = {"io_copy": (("x",), ("y",), lambda opset: [helper.make_node("Identity", ["x"], ["y"])]),
              "FusedConvRelu": (("x", "w"), ("y",), lambda opset: [helper.make_node("Conv", ["x", "w"], ["c"]),
                                                                  helper.make_node("Relu", ["c"], ["y"])])}
    for name, (inputs, outputs, body) in bodies.items():
        if get_op(name) is None:
            register_op(DomainOp(name, inputs, outputs, {}, body, "test stand-in", origin="tests"))
            added.append(name)
    yield
    for name in added:
        unregister_op(name)


def model_with_domains(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    """A model that may use ops of the mirserve domain (no checker: onnx has no schema for them)."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                  helper.make_opsetid("mirserve", 1)])


def test_a_value_crossing_memory_spaces_lives_in_both_arenas_at_its_io_copy(tmp_path, domain_ops):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("io_copy", ["a"], ["a_gpu"], name="to_gpu", domain="mirserve"),
             helper.make_node("Sigmoid", ["a_gpu"], ["s_gpu"], name="sigmoid_gpu"),
             helper.make_node("io_copy", ["s_gpu"], ["s"], name="to_host", domain="mirserve"),
             helper.make_node("io_copy", ["a"], ["a_arm"], name="x86_to_arm", domain="mirserve"),
             helper.make_node("Add", ["s", "a_arm"], ["y"], name="add")]
    model = model_with_domains(nodes, [vinfo("x", shape=[1, 64])], [vinfo("y", shape=[1, 64])])

    def place_on_devices(ir):
        cuda, arm = Place.parse("cuda/fp32/nchw"), Place.parse("arm/fp32/nchw")
        for name, place in (("a_gpu", cuda), ("s_gpu", cuda), ("s", None), ("a_arm", arm)):
            value = ir.graph.value(name)
            value.dtype, value.shape, value.place = T.FLOAT, (1, 64), place
        ir.graph.value("a").place = Place.parse("x86/fp32/nchw")

    memory, _ = plan(tmp_path, model, prepare=place_on_devices)
    assert [a["space"] for a in memory["arenas"]] == ["cuda", "host"]
    # a (host) is live at the copy (step 1) and after: x86 -> arm is a view of the same bytes, read at step 5.
    assert spans(memory, "host") == {"a": (0, 5, 256), "s": (3, 5, 256)}
    assert spans(memory, "cuda") == {"a_gpu": (1, 3, 256)}  # s_gpu written in place over a_gpu
    assert arena(memory, "cuda")["timeline"] == [0, 256, 256, 256, 0, 0]
    assert memory["paddle_lite_style_bytes"] == {"cuda": 256, "host": 512}


def if_model() -> onnx.ModelProto:
    then_body = helper.make_graph(
        [helper.make_node("Mul", ["a", "a"], ["t1"], name="then_mul"),
         helper.make_node("Sigmoid", ["t1"], ["t2"], name="then_sigmoid"),
         helper.make_node("Add", ["t2", "a"], ["then_out"], name="then_add")],
        "then", [], [vinfo("then_out", shape=[1, 64])])
    else_body = helper.make_graph([helper.make_node("Neg", ["a"], ["else_out"], name="else_neg")],
                                  "else", [], [vinfo("else_out", shape=[1, 64])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["cond"], ["branch"], name="if", then_branch=then_body,
                              else_branch=else_body),
             helper.make_node("Relu", ["branch"], ["y"], name="relu_out")]
    return make_model(nodes, [vinfo("x", shape=[1, 64]), vinfo("cond", T.BOOL, [])],
                      [vinfo("y", shape=[1, 64])])


def test_if_bodies_are_planned_on_their_own_and_charged_at_the_if(tmp_path):
    memory, entry = plan(tmp_path, if_model())
    # The then-branch needs one 256-byte buffer (t1, then t2 in place); the else-branch none: the If step
    # carries 256 bytes of scratch, and a, read inside the bodies, stays live until the If runs.
    assert spans(memory) == {"a": (0, 1, 256), "branch": (1, 2, 256), "if:scratch:host": (1, 1, 256)}
    assert arena(memory)["lower_bound_bytes"] == 768 and arena(memory)["peak_node"] == "if"
    assert entry["in_place"] == 1


def test_loop_body_is_charged_at_the_loop(tmp_path):
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Mul", ["v_in", "a"], ["t"], name="body_mul"),
         helper.make_node("Add", ["t", "a"], ["v_out"], name="body_add")],
        "body", [vinfo("i", T.INT64, []), vinfo("cond_in", T.BOOL, []), vinfo("v_in", shape=[1, 64])],
        [vinfo("cond_out", T.BOOL, []), vinfo("v_out", shape=[1, 64])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Loop", ["trips", "", "x"], ["v"], name="loop", body=body),
             helper.make_node("Add", ["v", "x"], ["y"], name="add")]
    model = make_model(nodes, [vinfo("x", shape=[1, 64])], [vinfo("y", shape=[1, 64])],
                       [tensor("trips", np.array(3, np.int64))])
    memory, _ = plan(tmp_path, model)
    # type_inference gives the carried output v the static shape its body keeps (onnx alone leaves none).
    assert memory["unplanned"] == []
    # The body's t is its only intermediate (v_out is the body's output): 256 bytes charged at the Loop.
    assert spans(memory) == {"a": (0, 1, 256), "v": (1, 2, 256), "loop:scratch:host": (1, 1, 256)}


def test_macs_per_node_and_total_including_fused_ops(tmp_path, domain_ops):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("FusedConvRelu", ["c", "w2"], ["f"], name="fused", domain="mirserve"),
             helper.make_node("Flatten", ["f"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "fc"], ["g"], name="gemm"),
             helper.make_node("MatMul", ["g", "proj"], ["y"], name="matmul")]
    model = model_with_domains(
        nodes, [vinfo("x", shape=[1, 3, 8, 8])], [vinfo("y", shape=[1, 5])],
        [tensor("w", np.ones((4, 3, 3, 3), np.float32)), tensor("w2", np.ones((2, 4, 1, 1), np.float32)),
         tensor("fc", np.ones((128, 10), np.float32)), tensor("proj", np.ones((10, 5), np.float32))])
    memory, _ = plan(tmp_path, model)
    expected = {"conv": 4 * 64 * 27, "fused": 2 * 64 * 4, "gemm": 10 * 128, "matmul": 5 * 10}
    assert {n["node"]: n["macs"] for n in memory["macs"]["nodes"]} == expected
    assert memory["macs"]["total"] == sum(expected.values()) and memory["macs"]["unknown"] == []


def test_a_body_that_cannot_be_planned_leaves_its_parents_space_unplanned(tmp_path):
    then_body = helper.make_graph(
        [helper.make_node("NonZero", ["a"], ["nz"], name="then_nonzero"),
         helper.make_node("ReduceSum", ["nz"], ["then_out"], name="then_sum", keepdims=0)],
        "then", [], [vinfo("then_out", T.INT64, [])])
    else_body = helper.make_graph([helper.make_node("ReduceMax", ["a_int"], ["else_out"], name="else_max",
                                                    keepdims=0)],
                                  "else", [], [vinfo("else_out", T.INT64, [])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Cast", ["a"], ["a_int"], name="cast", to=T.INT64),
             helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_body, else_branch=else_body)]
    model = make_model(nodes, [vinfo("x", shape=[1, 64]), vinfo("cond", T.BOOL, [])],
                       [vinfo("y", T.INT64, [])])
    memory, _ = plan(tmp_path, model)
    assert memory["arenas"] == []
    (entry,) = [e for e in memory["unplanned"] if e["kind"] == "subgraph"]
    assert (entry["node"], entry["op"]) == ("if", "If")
    assert "the size of 'nz' (NonZero node 'then_nonzero') depends on the input data" in entry["reason"]
    bounded, _ = plan(tmp_path, model, dim_bounds={"nz": 10})
    assert spans(bounded)["if:scratch:host"] == (2, 2, 192)  # nz: 2 x 10 int64 = 160 bytes, aligned
