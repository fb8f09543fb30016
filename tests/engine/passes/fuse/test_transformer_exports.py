"""The transformer fusions on real exports: models of the transformers library built from tiny random configs
(one layer, hidden 32) and exported by both torch exporters (``bench/transformer_exports.py --size tiny``,
committed in tests/engine/data/transformers). Raised to opset 23 and run at --portable, each loses the
decomposed forms the fusions target, and every output agrees with the export's on onnxruntime."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from worker.engine.api import optimize
from worker.engine.options import OptimizeOptions

DATA = Path(__file__).resolve().parents[2] / "data" / "transformers"
EXPORTERS = ("dynamo", "torchscript")

#: model -> the fused ops the one-layer export must end with (standard ops only), and the op types that
#: must be gone. An RMSNorm model has two per layer and one final norm; rotary models rotate q and k; one
#: attention per layer (grouped-query ones without their repeat_kv Expand).
EXPECTED = {
    "bert": ({"Gelu": 1, "Attention": 1}, {"Erf", "Div", "Softmax"}),
    "gpt2": ({"Gelu": 1, "Attention": 1}, {"Tanh", "Pow", "Softmax"}),
    "phi": ({"Gelu": 1, "RotaryEmbedding": 2, "Attention": 1}, {"Tanh", "Pow", "Slice", "Split", "Neg", "Softmax"}),
    "llama": ({"RMSNormalization": 3, "RotaryEmbedding": 2, "Attention": 1},
              {"ReduceMean", "Pow", "Sqrt", "Reciprocal", "Div", "Slice", "Split", "Neg", "Softmax", "Expand"}),
    "qwen2": ({"RMSNormalization": 3, "RotaryEmbedding": 2, "Attention": 1},
              {"ReduceMean", "Pow", "Sqrt", "Reciprocal", "Div", "Slice", "Split", "Neg", "Softmax", "Expand"}),
    "t5_encoder": ({"RMSNormalization": 3, "Attention": 1}, {"ReduceMean", "Pow", "Sqrt", "Reciprocal", "Softmax"}),
}
CASES = [(model, exporter) for model in EXPECTED for exporter in EXPORTERS]


@pytest.mark.models
@pytest.mark.parametrize("model, exporter", CASES, ids=[f"{m}.{e}" for m, e in CASES])
def test_portable_output_at_opset_23_has_the_fused_ops(tmp_path, model, exporter):
    source = DATA / f"{model}.{exporter}.onnx"
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(portable=True, target_opset=23, verify_runs=2))
    assert report["verification"]["passed"], report["verification"]
    ops = Counter(node.op_type for node in onnx.load(str(tmp_path / "out.onnx")).graph.node)
    fused, gone = EXPECTED[model]
    assert {op: ops[op] for op in fused} == fused
    assert not {op for op in gone if ops[op]}, ops
    assert report["model"]["output"]["nodes"] < len(onnx.load(str(source)).graph.node)


@pytest.mark.models
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_at_the_exporters_opset_only_what_the_opset_has_is_fused(tmp_path, exporter):
    """Without --target-opset, a TorchScript export (opset 17) keeps its RMSNorm chains and says why."""
    source = DATA / f"llama.{exporter}.onnx"
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(portable=True))
    assert report["verification"]["passed"]
    ops = Counter(node.op_type for node in onnx.load(str(tmp_path / "out.onnx")).graph.node)
    assert ops["RMSNormalization"] == 0 and ops["Split"] == 2
    refusals = [r for entry in report["trace"] if entry["pass"] == "rms_norm_fuse" for r in entry.get("refusals", {})]
    opset = 20 if exporter == "dynamo" else 17
    assert any(f"RMSNormalization needs opset 23, and the model imports opset {opset}" in r for r in refusals)


#: model -> the own-domain ops the default run (level 2, the export's own opset) must end with.
#: (llama's grouped-query keys keep the 4-D op; T5's and GPT-2's heads, split from the hidden size, go into the
#: 3-D one)
DOMAIN_EXPECTED = {"llama": {"RMSNorm": 3, "ScaledDotProductAttention": 1},
                   "t5_encoder": {"RMSNorm": 3, "MultiHeadAttention": 1},
                   "gpt2": {"GeluTanh": 1, "MultiHeadAttention": 1}}


@pytest.mark.models
@pytest.mark.parametrize("model", list(DOMAIN_EXPECTED))
def test_default_run_at_opset_17_fuses_into_domain_ops_with_bodies(tmp_path, model):
    """The TorchScript exports (opset 17) get no standard RMSNormalization, Gelu or Attention, so the default
    run emits the mirserve ops, whose function bodies onnxruntime runs in verification."""
    source = DATA / f"{model}.torchscript.onnx"
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(verify_runs=2))
    assert report["verification"]["passed"], report["verification"]
    saved = onnx.load(str(tmp_path / "out.onnx"))
    ops = Counter(node.op_type for node in saved.graph.node if node.domain == "mirserve")
    assert {op: ops[op] for op in DOMAIN_EXPECTED[model]} == DOMAIN_EXPECTED[model]
    assert set(DOMAIN_EXPECTED[model]) <= {f.name for f in saved.functions}
    assert "Softmax" not in {node.op_type for node in saved.graph.node}


@pytest.mark.models
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
def test_make_llama_fp16_gets_rotary_and_attention(tmp_path, static):
    """bench/make_llama.py's Llama graph (fp16, Softmax in float between Casts, GQA 8/2 heads, dynamic batch and
    sequence): every attention (with its repeat_kv) is fused at --portable --target-opset 23, and with the input
    shape given every rotary too (its cos/sin are then constants); it verifies."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[4]
    source = tmp_path / "llama.onnx"
    subprocess.run([sys.executable, str(repo / "bench" / "make_llama.py"), str(source), "--layers", "2", "--hidden",
                    "256", "--heads", "8", "--kv-heads", "2", "--intermediate", "688", "--vocab", "1000"],
                   check=True, capture_output=True)
    from worker.engine.api import run_cli

    # The command line: external data is read only from a local model given there.
    code = run_cli(["optimize", str(source), "-o", str(tmp_path / "out.onnx"), "--portable", "--target-opset", "23",
                    *(["--input-shape", "input_ids=1,16"] if static else []), "--quiet",
                    "--report", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0 and report["verification"]["passed"], report["verification"]
    ops = Counter(node.op_type for node in onnx.load(str(tmp_path / "out.onnx"), load_external_data=False).graph.node)
    assert (ops["RMSNormalization"], ops["RotaryEmbedding"], ops["Attention"]) == (5, 4 if static else 0, 2), ops
    assert not ops["Softmax"] and not ops["Expand"] and (not ops["Neg"]) == static


#: model -> exporters: decoders with a past KV cache, sdpa attention (a boolean mask, torch's decomposition),
#: and sdpa without padding (torch's is_causal; its TorchScript export fails on aten::diff).
ATTENTION_FORMS = {"gpt2_past": EXPORTERS, "llama_past": EXPORTERS, "llama_sdpa": EXPORTERS,
                   "qwen2_sdpa_past": EXPORTERS, "llama_sdpa_causal": ("dynamo",)}
FORM_CASES = [(model, exporter) for model, exporters in ATTENTION_FORMS.items() for exporter in exporters]


@pytest.mark.models
@pytest.mark.parametrize("model, exporter", FORM_CASES, ids=[f"{m}.{e}" for m, e in FORM_CASES])
def test_attention_forms_become_one_attention_per_layer(tmp_path, model, exporter):
    """The cache goes into the op (its present outputs are the graph's), a boolean mask stays boolean, and an
    unpadded causal mask becomes is_causal; the outputs agree with the export's on onnxruntime."""
    source = DATA / f"{model}.{exporter}.onnx"
    report = optimize(source, tmp_path / "out.onnx", OptimizeOptions(portable=True, target_opset=23, verify_runs=2))
    assert report["verification"]["passed"], report["verification"]
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(tmp_path / "out.onnx"))).graph
    ops = Counter(node.op_type for node in graph.node)
    assert ops["Attention"] == 1 and not ops["Softmax"] and not ops["IsNaN"] and not ops["Expand"], ops
    attention = next(node for node in graph.node if node.op_type == "Attention")
    if model.endswith("_past"):
        assert not ops["Concat"] and list(attention.input[4:]) == ["past_key_0", "past_value_0"]
        assert list(attention.output[1:]) == ["present_key_0", "present_value_0"]
    if model.endswith("_causal"):
        assert {a.name: a.i for a in attention.attribute}.get("is_causal") == 1 and len(attention.input) == 3
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input]}
    if "sdpa" in model and exporter == "torchscript":  # its mask fills with -inf: boolean in the op
        assert types[attention.input[3]] == onnx.TensorProto.BOOL
