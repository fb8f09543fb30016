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
[--exporter dynamo|torchscript] [--force] [--list]``. Prints one line per export: its node count or why it
failed (an export that fails is reported and the run goes on; the exit status is 1 if any failed).
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
VOCAB = 256

# The sizes every text config shares (names differ per architecture, so each builder maps them).
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 128


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


def _bert_like(**extra) -> dict:
    return {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "intermediate_size": INTERMEDIATE, "max_position_embeddings": 64, **extra}


def _llama_like(**extra) -> dict:
    return {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "intermediate_size": INTERMEDIATE, "max_position_embeddings": 64,
            **extra}


MODELS: dict[str, Export] = {
    "bert": Export("BertConfig", "BertModel", _bert_like()),
    "roberta": Export("RobertaConfig", "RobertaModel", _bert_like(pad_token_id=1)),
    "distilbert": Export("DistilBertConfig", "DistilBertModel",
                         {"vocab_size": VOCAB, "dim": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS,
                          "hidden_dim": INTERMEDIATE, "max_position_embeddings": 64}),
    "albert": Export("AlbertConfig", "AlbertModel", _bert_like(embedding_size=32)),
    "vit": Export("ViTConfig", "ViTModel",
                  {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                   "intermediate_size": INTERMEDIATE, "image_size": 32, "patch_size": 8}, inputs="image"),
    "gpt2": Export("GPT2Config", "GPT2Model",
                   {"vocab_size": VOCAB, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS, "n_positions": 64,
                    "use_cache": False, "bos_token_id": 0, "eos_token_id": 0}, inputs="decoder"),
    "gpt_neox": Export("GPTNeoXConfig", "GPTNeoXModel",
                       {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
                        "num_attention_heads": HEADS, "intermediate_size": INTERMEDIATE,
                        "max_position_embeddings": 64, "use_cache": False}, inputs="decoder"),
    "llama": Export("LlamaConfig", "LlamaModel", _llama_like(use_cache=False), inputs="decoder"),
    "mistral": Export("MistralConfig", "MistralModel", _llama_like(use_cache=False, sliding_window=None),
                      inputs="decoder"),
    "qwen2": Export("Qwen2Config", "Qwen2Model", _llama_like(use_cache=False), inputs="decoder"),
    "phi": Export("PhiConfig", "PhiModel", _llama_like(use_cache=False), inputs="decoder"),
    "t5_encoder": Export("T5Config", "T5EncoderModel",
                         {"vocab_size": VOCAB, "d_model": HIDDEN, "d_kv": HIDDEN // HEADS, "d_ff": INTERMEDIATE,
                          "num_layers": LAYERS, "num_heads": HEADS}),
    "bart_encoder": Export("BartConfig", "BartModel",
                           {"vocab_size": VOCAB, "d_model": HIDDEN, "encoder_layers": LAYERS,
                            "decoder_layers": LAYERS, "encoder_attention_heads": HEADS,
                            "decoder_attention_heads": HEADS, "encoder_ffn_dim": INTERMEDIATE,
                            "decoder_ffn_dim": INTERMEDIATE, "max_position_embeddings": 64}, inputs="encoder"),
    "whisper_encoder": Export("WhisperConfig", "WhisperModel",
                              {"vocab_size": VOCAB, "d_model": HIDDEN, "encoder_layers": LAYERS,
                               "decoder_layers": LAYERS, "encoder_attention_heads": HEADS,
                               "decoder_attention_heads": HEADS, "encoder_ffn_dim": INTERMEDIATE,
                               "decoder_ffn_dim": INTERMEDIATE, "num_mel_bins": 80,
                               "max_source_positions": 16, "max_target_positions": 16, "pad_token_id": 0,
                               "bos_token_id": 0, "eos_token_id": 0, "decoder_start_token_id": 1}, inputs="audio"),
}


def build(name: str):
    """The model (eval mode, eager attention so the export holds the attention arithmetic) and its inputs."""
    import torch
    import transformers

    spec = MODELS[name]
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
    ids = torch.randint(3, VOCAB, (1, SEQUENCE), generator=generator)
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


def export(name: str, exporter: str, path: Path) -> None:
    import torch

    model, inputs = build(name)
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
                    export(name, exporter, path)
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
