"""Export transformer models of the transformers library, built from small random configs (nothing
downloaded), to ONNX with both torch exporters, into a cache directory: the inputs the transformer fusions
(gelu_fuse, rms_norm_fuse, split_fuse, ...) and the transformer benchmark rows are measured on.

Each architecture is the library's own model class at a small size (2 layers, hidden 64, 4 heads, vocabulary
256; Llama-family decoders with grouped-query attention, 4 query heads over 2 KV heads), so every export keeps
the real decomposed forms the exporters write (GELU chains, RMSNorm chains, rotary embedding, attention
with its mask arithmetic) at a size that exports in seconds. Both exporters:

- ``dynamo``: ``torch.onnx.export(..., dynamo=True)`` (torch.export + onnxscript), the exporter's default opset;
- ``torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=17)``.

Inputs are static (batch 1, sequence 16; images 1x3x32x32; audio 1x80x32 mel frames), no KV cache
(``use_cache=False``). Files are named ``<model>.<exporter>.onnx`` in ``--out`` (default
``bench/out/transformers``, gitignored); an existing file is kept unless ``--force``.

Run with the torch environment: ``/work/bench-env/venv/bin/python bench/transformer_exports.py [--only NAME]
[--exporter dynamo|torchscript] [--size bench|tiny] [--out DIR] [--force] [--list]``. Prints one line per export:
its node count or why it failed (an export that fails is reported and the run goes on; the exit status is 1
if any failed).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "transformers"
EXPORTERS = ("dynamo", "torchscript")
SEQUENCE = 16


@dataclass(frozen=True)
class Size:
    """The sizes every config shares (names differ per architecture, so each entry maps them)."""
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int = 4
    kv_heads: int = 2


#: ``bench``: the benchmark's exports; ``tiny``: the test fixtures in tests/engine/data/transformers (one
#: layer, about 100 kB each, committed), the same decomposed forms; vocabularies stay above 100 because
#: verification draws token ids below 100.
SIZES = {"bench": Size(hidden=64, layers=2, intermediate=128, vocab=256),
         "tiny": Size(hidden=32, layers=1, intermediate=64, vocab=128)}


@dataclass(frozen=True)
class Export:
    #: The transformers config and model class names.
    config: str
    model: str
    #: Config keyword arguments.
    settings: dict
    #: "text" (input_ids, attention_mask), "decoder" (input_ids, attention_mask, causal), "image"
    #: (pixel_values), "audio" (input_features) or "encoder" (an encoder-decoder model's encoder alone).
    inputs: str = "text"


def models(size: Size = SIZES["bench"]) -> dict[str, Export]:
    """Every architecture at ``size``."""
    hidden, layers, heads, inter, vocab = size.hidden, size.layers, size.heads, size.intermediate, size.vocab
    bert_like = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
                 "num_attention_heads": heads, "intermediate_size": inter, "max_position_embeddings": 64}
    llama_like = {**bert_like, "num_key_value_heads": size.kv_heads, "use_cache": False}
    seq2seq = {"vocab_size": vocab, "d_model": hidden, "encoder_layers": layers, "decoder_layers": layers,
               "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": inter,
               "decoder_ffn_dim": inter}
    return {
        "bert": Export("BertConfig", "BertModel", bert_like),
        "roberta": Export("RobertaConfig", "RobertaModel", {**bert_like, "pad_token_id": 1}),
        "distilbert": Export("DistilBertConfig", "DistilBertModel",
                             {"vocab_size": vocab, "dim": hidden, "n_layers": layers, "n_heads": heads,
                              "hidden_dim": inter, "max_position_embeddings": 64}),
        "albert": Export("AlbertConfig", "AlbertModel", {**bert_like, "embedding_size": hidden // 2}),
        "vit": Export("ViTConfig", "ViTModel",
                      {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                       "intermediate_size": inter, "image_size": 32, "patch_size": 8}, inputs="image"),
        "gpt2": Export("GPT2Config", "GPT2Model",
                       {"vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads,
                        "n_positions": 64, "use_cache": False, "bos_token_id": 0, "eos_token_id": 0},
                       inputs="decoder"),
        "gpt_neox": Export("GPTNeoXConfig", "GPTNeoXModel", {**bert_like, "use_cache": False}, inputs="decoder"),
        "llama": Export("LlamaConfig", "LlamaModel", llama_like, inputs="decoder"),
        "mistral": Export("MistralConfig", "MistralModel", {**llama_like, "sliding_window": None},
                          inputs="decoder"),
        "qwen2": Export("Qwen2Config", "Qwen2Model", llama_like, inputs="decoder"),
        "phi": Export("PhiConfig", "PhiModel", llama_like, inputs="decoder"),
        "t5_encoder": Export("T5Config", "T5EncoderModel",
                             {"vocab_size": vocab, "d_model": hidden, "d_kv": hidden // heads, "d_ff": inter,
                              "num_layers": layers, "num_heads": heads}),
        "bart_encoder": Export("BartConfig", "BartModel", {**seq2seq, "max_position_embeddings": 64},
                               inputs="encoder"),
        "whisper_encoder": Export("WhisperConfig", "WhisperModel",
                                  {**seq2seq, "num_mel_bins": 80, "max_source_positions": 16,
                                   "max_target_positions": 16, "pad_token_id": 0, "bos_token_id": 0,
                                   "eos_token_id": 0, "decoder_start_token_id": 1}, inputs="audio"),
    }


MODELS = models()


def build(name: str, size: Size = SIZES["bench"]):
    """The model (eval mode, eager attention so the export holds the attention arithmetic) and its inputs."""
    import torch
    import transformers

    spec = models(size)[name]
    config = getattr(transformers, spec.config)(**spec.settings)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, spec.model)(config).eval()
    if spec.inputs == "encoder" or spec.inputs == "audio":
        model = model.get_encoder()
    generator = torch.Generator().manual_seed(0)
    if spec.inputs == "image":
        return model, {"pixel_values": torch.rand(1, 3, 32, 32, generator=generator)}
    if spec.inputs == "audio":
        frames = 2 * config.max_source_positions  # the encoder's two convolutions halve the frames
        return model, {"input_features": torch.rand(1, config.num_mel_bins, frames, generator=generator)}
    ids = torch.randint(3, size.vocab, (1, SEQUENCE), generator=generator)
    mask = torch.ones(1, SEQUENCE, dtype=torch.int64)
    return model, {"input_ids": ids, "attention_mask": mask}


def _wrapped(model, names: list[str]):
    """The model taking its inputs by position and returning its last hidden state (one plain output)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args)), return_dict=True).last_hidden_state

    return Wrapped()


def export(name: str, exporter: str, path: Path, size: Size = SIZES["bench"]) -> None:
    import torch

    model, inputs = build(name, size)
    wrapped = _wrapped(model, list(inputs))
    args = tuple(inputs.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(wrapped, args, dynamo=True, input_names=list(inputs),
                                        output_names=["last_hidden_state"], external_data=False)
            program.save(str(path))
        else:
            torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=17, input_names=list(inputs),
                              output_names=["last_hidden_state"], do_constant_folding=True)


def exported(names=None, exporters=EXPORTERS, out: Path = OUT) -> list[Path]:
    """The cached exports that exist, for tests and the benchmark (``models``-marked tests skip without them)."""
    return [path for name in (names or MODELS) for exporter in exporters
            if (path := out / f"{name}.{exporter}.onnx").exists()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(MODELS), help="export this model (repeatable)")
    parser.add_argument("--exporter", action="append", choices=EXPORTERS, help="only this exporter")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--size", choices=list(SIZES), default="bench",
                        help="bench: 2 layers, hidden 64 (default); tiny: the committed test fixtures")
    parser.add_argument("--force", action="store_true", help="export again even if the file exists")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(MODELS))
        return 0
    import onnx

    failed = False
    for name in args.only or MODELS:
        for exporter in args.exporter or EXPORTERS:
            path = args.out / f"{name}.{exporter}.onnx"
            started = time.perf_counter()
            try:
                if args.force or not path.exists():
                    export(name, exporter, path, SIZES[args.size])
                model = onnx.load(str(path))
                opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
                print(f"{path.name}: {len(model.graph.node)} nodes, opset {opset}, "
                      f"{time.perf_counter() - started:.1f} s", flush=True)
            except Exception as error:  # one failed export must not hide the others
                failed = True
                path.unlink(missing_ok=True)
                message = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
                print(f"{path.name}: FAILED ({type(error).__name__}: {message})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
