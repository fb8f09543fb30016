"""The "Done when" of memory planning, on every corpus and light model-zoo model (fp32, batch 1, static shapes).

Each model runs through the default pipeline, so the plan is made over the final execution order of whatever
passes have landed. The independent checker (tests/engine/memory/plan_checker.py) reads only the report.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CORPUS, all_models, corpus_models, model_id, shapes_for
from tests.engine.memory.plan_checker import check_memory_report
from worker.engine.ir import load_model
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager, get_pipeline
from worker.engine.inference import apply_input_shapes
from worker.engine.places import parse_places


def batch_one(path: Path) -> dict:
    return {name: [1, *dims[1:]] for name, dims in shapes_for(path).items()}


def memory_of(path: Path, disabled: tuple[str, ...] = (), places: str | None = None) -> dict:
    return run_of(path, disabled, places).report["memory"]


def run_of(path: Path, disabled: tuple[str, ...] = (), places: str | None = None) -> PassContext:
    model = load_model(path)
    options = OptimizeOptions(input_shapes=batch_one(path), disabled_passes=disabled,
                              **({"places": places} if places else {}))
    apply_input_shapes(model.graph, options.input_shapes)
    ctx = PassContext(model, options, parse_places(options.places))
    PassManager().run(ctx, get_pipeline("default").steps_for(options))
    return ctx


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_every_arena_is_sound_within_one_percent_of_the_bound_and_never_above_paddle_lite(path):
    memory = memory_of(path)
    assert check_memory_report(memory) == []
    assert memory["arenas"], "nothing was planned"
    assert {e["kind"] for e in memory["unplanned"]} <= {"unread_output"}
    for arena in memory["arenas"]:
        assert arena["arena_bytes"] <= 1.01 * arena["lower_bound_bytes"]
        assert arena["arena_bytes"] <= memory["paddle_lite_style_bytes"][arena["space"]]
        assert arena["naive_bytes"] >= arena["arena_bytes"]
    assert memory["macs"]["total"] > 0 and memory["macs"]["unknown"] == []
    assert memory["io_bytes"] > 0 and sum(memory["weights_bytes"].values()) > 0


def test_the_plan_is_the_same_on_every_run():
    path = next(p for p in all_models() if p.stem == "light_inception_v1")
    assert memory_of(path) == memory_of(path)


def test_vgg19_macs_match_the_published_figure():
    # Simonyan & Zisserman: VGG-19 needs 19.6 billion multiply-adds for a 224 x 224 image.
    path = next(p for p in all_models() if p.stem == "light_vgg19")
    assert memory_of(path)["macs"]["total"] == pytest.approx(19.6e9, rel=0.01)


def test_an_unread_output_of_unknown_size_is_left_out_without_blocking_the_arena():
    # light_squeezenet (opset 9) has a Dropout whose mask nobody reads and whose type onnx does not infer
    # (kept here by disabling the pass that removes inference Dropouts).
    path = next(p for p in all_models() if p.stem == "light_squeezenet")
    memory = memory_of(path, disabled=("identity_dropout_eliminate",))
    (entry,) = memory["unplanned"]
    assert (entry["kind"], entry["op"]) == ("unread_output", "Dropout")
    assert memory["arenas"][0]["space"] == "host"
    assert entry["value"] not in {v["name"] for v in memory["arenas"][0]["values"]}


@pytest.mark.parametrize("path", all_models(), ids=model_id)
def test_macs_are_the_same_on_an_nhwc_fp16_place_as_on_x86(path):
    """MACs count the work of the model, not of its place: NHWC forms and fused ops count through their bodies."""
    x86 = memory_of(path)["macs"]
    arm_run = run_of(path, places="arm/fp16/nhwc,arm/fp32/nchw")
    arm = arm_run.report["memory"]["macs"]
    assert x86["unknown"] == [] and arm["unknown"] == []
    assert arm["total"] == pytest.approx(x86["total"], rel=0.01) and x86["total"] > 0
    nhwc = [n for n in arm_run.graph.all_nodes() if n.domain == "mirserve" and n.op_type.startswith("Nhwc")]
    if any(n.op_type.startswith(("NhwcConv", "NhwcFusedConv")) for n in nhwc):  # the case the figures missed
        counted = {n["node"] for n in arm["nodes"]}
        assert all(n.name in counted for n in nhwc if "Conv" in n.op_type)


@pytest.mark.parametrize("places", ["npu/int8/nchw,arm/fp32/nchw", "opencl/fp16/nchw,arm/fp32/nchw"])
@pytest.mark.parametrize("path", corpus_models(), ids=model_id)
def test_macs_are_the_same_on_the_other_done_when_places(path, places):
    """Quantized forms (QLinearConv on the int8 place) and fused ops count what the float graph does."""
    x86, other = memory_of(path)["macs"], memory_of(path, places=places)["macs"]
    assert other["unknown"] == [] and x86["total"] > 0
    assert other["total"] == pytest.approx(x86["total"], rel=0.01)


@pytest.mark.models
def test_fused_attention_counts_what_its_matmuls_did():
    """BERT at opset 23: attention_fuse makes standard Attention nodes; their count equals the Q K^T and
    weights x V MatMuls they replace, so the total does not move."""
    path = next(p for p in all_models() if p.stem == "bert_small_dyn")

    def macs(disabled: tuple[str, ...]) -> dict:
        model = load_model(path, target_opset=23)
        options = OptimizeOptions(input_shapes={"input_ids": [2, 64], "attention_mask": [2, 64]},
                                  disabled_passes=disabled, target_opset=23)
        apply_input_shapes(model.graph, options.input_shapes)
        ctx = PassContext(model, options, parse_places(options.places))
        PassManager().run(ctx, get_pipeline("default").steps_for(options))
        return ctx.report["memory"]["macs"]

    fused, unfused = macs(()), macs(("attention_fuse",))
    attention = [n for n in fused["nodes"] if n["op"] == "Attention"]
    assert attention and fused["unknown"] == [] and unfused["unknown"] == []
    assert fused["total"] == unfused["total"]


@pytest.mark.models
def test_the_inference_proto_written_once_per_sizing_gives_the_same_plan(monkeypatch, tmp_path):
    """types_at writes the model for onnx's inference once and refreshes only its inputs' and outputs' types;
    the memory section (plans and formulas over eight sizes) is the same as writing it every time."""
    import json

    from worker.engine import inference
    from worker.engine.api import OptimizeOptions, optimize

    model = CORPUS / "bert_small_dyn.onnx"
    options = OptimizeOptions(verify=False)
    cached = optimize(model, tmp_path / "a.onnx", options)["memory"]
    monkeypatch.setattr(inference, "_inference_proto",
                        lambda m: inference.model_to_proto(m, with_weights=False, value_info=False))
    fresh = optimize(model, tmp_path / "b.onnx", options)["memory"]
    assert cached["symbolic"]["spaces"] and json.dumps(cached, sort_keys=True, default=str) == json.dumps(
        fresh, sort_keys=True, default=str)
