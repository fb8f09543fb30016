"""type_cast_cleanup: chains that cancel go, lossy round trips stay, casts of constants fold, duplicates merge."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from tests.conftest import CORPUS, CORPUS_SHAPES
from tests.engine.passes.place.helpers import check_annotations, check_edges, place_model, trace_entry
from worker.engine.ir import Graph, Model, Value, save_model
from worker.engine.ir.verify import verify_graph
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext
from worker.engine.passes.support.casts import cast_kind
from worker.engine.passes.place.type_cast_cleanup import type_cast_cleanup
from worker.engine.places import Place, parse_places

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
ARM32, ARM16 = Place.parse("arm/fp32/nchw"), Place.parse("arm/fp16/nchw")


def graph_with(chain: list[tuple[str, dict, Place, int]], source_dtype=F32, source_place=ARM32):
    """x -> casts of ``chain`` (kind, attributes, output place, dtype) -> Relu -> y."""
    graph = Graph("g")
    value = graph.add_input(Value("x", source_dtype, (1, 4, 2, 3)))
    value.place = source_place
    for kind, attributes, place, dtype in chain:
        node = graph.add_node(kind, [value], [f"{kind}_out"], domain="mirserve", attributes=attributes)
        value = node.output()
        value.dtype, value.place = dtype, place
        if kind == "layout":
            value.shape = tuple(np.array((1, 4, 2, 3))[list(attributes["perm"])])
        else:
            value.shape = (1, 4, 2, 3)
    relu = graph.add_node("Relu", [value], ["y"])
    relu.output().dtype = value.dtype
    graph.set_outputs([relu.output()])
    return graph


def cleanup(graph: Graph) -> dict:
    model = Model(graph, ir_version=10, opset_imports={"": 17})
    options = OptimizeOptions(places="arm/fp32/nchw")
    result = type_cast_cleanup(PassContext(model, options, parse_places(options.places)))
    verify_graph(graph)
    return result.data


def kinds(graph: Graph) -> list[str]:
    return [cast_kind(n) for n in graph if cast_kind(n)]


def test_layout_round_trip_cancels():
    nhwc = Place.parse("arm/fp32/nhwc")
    graph = graph_with([("layout", {"perm": [0, 2, 3, 1]}, nhwc, F32), ("layout", {"perm": [0, 3, 1, 2]}, ARM32, F32)])
    assert cleanup(graph)["cancelled"] == 1
    assert kinds(graph) == [] and graph.nodes_of_type("Relu")[0].input(0).name == "x"


def test_copy_round_trip_cancels():
    opencl = Place.parse("opencl/fp32/nchw")
    graph = graph_with([("io_copy", {}, opencl, F32), ("io_copy", {}, ARM32, F32)])
    assert cleanup(graph)["cancelled"] == 1 and kinds(graph) == []


def test_exact_calib_round_trip_cancels_but_a_lossy_one_stays():
    exact = graph_with([("calib", {"to": F32}, ARM32, F32), ("calib", {"to": F16}, ARM16, F16)],
                       source_dtype=F16, source_place=ARM16)
    assert cleanup(exact)["cancelled"] == 1 and kinds(exact) == []
    lossy = graph_with([("calib", {"to": F16}, ARM16, F16), ("calib", {"to": F32}, ARM32, F32)])
    assert cleanup(lossy)["cancelled"] == 0 and kinds(lossy) == ["calib", "calib"]


def test_casts_of_constants_are_folded_into_the_file():
    graph = Graph("g")
    weight = graph.add_initializer("w", np.arange(24, dtype=np.float32).reshape(1, 4, 2, 3))
    weight.place = ARM32
    calib = graph.add_node("calib", [weight], ["w16"], domain="mirserve", attributes={"to": F16})
    calib.output().dtype, calib.output().place = F16, ARM16
    relu = graph.add_node("Relu", [calib.output()], ["y"])
    graph.set_outputs([relu.output()])
    assert cleanup(graph)["folded"] == 1
    folded = relu.input(0)
    assert folded.is_initializer and folded.const.dtype == np.float16 and "w" not in graph.initializers
    np.testing.assert_array_equal(folded.const, np.arange(24, dtype=np.float16).reshape(1, 4, 2, 3))


def test_duplicate_casts_merge():
    graph = Graph("g")
    x = graph.add_input(Value("x", F32, (2,)))
    x.place = ARM32
    outs = []
    for i in range(2):
        node = graph.add_node("calib", [x], [f"c{i}"], domain="mirserve", attributes={"to": F16})
        node.output().dtype, node.output().place = F16, ARM16
        outs.append(graph.add_node("Relu", [node.output()], [f"y{i}"]).output())
    graph.set_outputs(outs)
    assert cleanup(graph)["merged"] == 1 and kinds(graph) == ["calib"]


def test_placing_a_placed_model_again_cancels_the_chains_it_would_stack(tmp_path):
    name = "ch_PP-OCRv4_det_infer.onnx"
    first = place_model(CORPUS / name, "opencl/fp16/nchw,arm/fp32/nchw", shapes=CORPUS_SHAPES[name],
                        verify_ir=False)
    save_model(first.model, tmp_path / "opencl.onnx")
    second = place_model(tmp_path / "opencl.onnx", "arm/fp16/nhwc,arm/fp32/nchw", shapes=CORPUS_SHAPES[name])
    cleanup = trace_entry(second, "type_cast_cleanup")
    # The first placement's casts become no-ops or cancel against the new ones; none may stay stacked.
    assert cleanup["cancelled"] + cleanup["no_ops"] > 0
    check_annotations(second.graph)
    check_edges(second)
