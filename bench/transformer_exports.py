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
(``use_cache=False``), eager attention; except the ``_past`` decoders, which take a cache of 8 positions per layer
as inputs (``past_key_<i>``, ``past_value_<i>``, the attention mask covering 24 positions) and return the
present cache (``present_key_<i>``, ``present_value_<i>``), and the ``_sdpa`` ones, whose attention is the
library's ``sdpa`` implementation (torch's scaled_dot_product_attention with a boolean mask, decomposed by the
exporters). The ``_dynamic`` decoders have a dynamic batch and sequence (traced at batch 2), so their rotary
cos and sin are computed at run time. Files are named ``<model>.<exporter>.onnx`` in ``--out`` (default
``bench/out/transformers``, gitignored); an existing file is kept unless ``--force``.

Run with the torch environment: ``/work/bench-env/venv/bin/python bench/transformer_exports.py [--only NAME]
[--third | --fourth | --fifth | --sixth | --seventh] [--exporter dynamo|torchscript] [--size bench|tiny] [--out DIR] [--force] [--list]``
(``--third``: the third sweep's batch alone, ``third_models``; ``--fourth``: ``fourth_models``; ``--fifth``: ``fifth_models``; ``--sixth``: ``sixth_models``; ``--seventh``: ``seventh_models``). Prints one line per export:
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
PAST = 8


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
    #: "text" (input_ids, attention_mask), "decoder" (input_ids, attention_mask, causal), "causal" (input_ids
    #: alone: no padding, so sdpa attention asks torch for is_causal), "image"
    #: (pixel_values), "video" (pixel_values 1 x frames x 3 x S x S), "audio" (input_features), "waveform" (input_values: raw audio samples, 1x640),
    #: "layout" (input_ids, attention_mask, bbox: a box per token), "timeseries" (past_values 1 x context x
    #: channels), "embeds" (inputs: 1 x 16 x d_model floats, a model without an input preprocessor),
    #: "encoder" (an encoder-decoder model's encoder alone), "seq2seq" (the whole encoder-decoder:
    #: input_ids, attention_mask, decoder_input_ids), "speech_seq2seq" (input_features 1x32x80, attention_mask,
    #: decoder_input_ids), "codec" (input_values: 1x1x640 raw audio), "spectrogram" (input_values: batch x
    #: frames x mel bins, AST) or "audio_seq2seq" (input_features batch x mel x frames, decoder_input_ids: Whisper).
    inputs: str = "text"
    #: The transformers attention implementation: "eager" (the arithmetic written out) or "sdpa".
    attention: str = "eager"
    #: Cached positions per layer given as inputs (a decoder's KV cache), 0 for none.
    past: int = 0
    #: Exported with a dynamic batch and sequence (see ``dynamic_models``).
    dynamic: bool = False
    #: The image side of "image" inputs (1x3xSxS).
    image_size: int = 32
    #: The model output returned (its first output; the present cache follows when ``past``).
    output: str = "last_hidden_state"


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
        # at least 4 rotary dims (2 frequencies), as every real GPT-NeoX has (16 of 64 at its 0.25): the bench
        # size keeps the default 0.25, the tiny one (8 per head) rotates half
        "gpt_neox": Export("GPTNeoXConfig", "GPTNeoXModel",
                           {**bert_like, "use_cache": False, "rotary_pct": max(0.25, 4 / (hidden // heads))},
                           inputs="decoder"),
        "llama": Export("LlamaConfig", "LlamaModel", llama_like, inputs="decoder"),
        "mistral": Export("MistralConfig", "MistralModel", {**llama_like, "sliding_window": None},
                          inputs="decoder"),
        "qwen2": Export("Qwen2Config", "Qwen2Model", llama_like, inputs="decoder"),
        "gpt2_past": Export("GPT2Config", "GPT2Model",
                            {"vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads,
                             "n_positions": 64, "use_cache": True, "bos_token_id": 0, "eos_token_id": 0},
                            inputs="decoder", past=PAST),
        "llama_past": Export("LlamaConfig", "LlamaModel", {**llama_like, "use_cache": True}, inputs="decoder",
                             past=PAST),
        "qwen2_past": Export("Qwen2Config", "Qwen2Model", {**llama_like, "use_cache": True}, inputs="decoder",
                             past=PAST),
        "llama_sdpa": Export("LlamaConfig", "LlamaModel", llama_like, inputs="decoder", attention="sdpa"),
        "llama_sdpa_causal": Export("LlamaConfig", "LlamaModel", llama_like, inputs="causal", attention="sdpa"),
        "qwen2_sdpa_past": Export("Qwen2Config", "Qwen2Model", {**llama_like, "use_cache": True},
                                  inputs="decoder", attention="sdpa", past=PAST),
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
        **_more_models(size, bert_like, seq2seq),
    }


def _more_models(size: Size, bert_like: dict, seq2seq: dict) -> dict[str, Export]:
    """Architectures with patterns the ones above lack: disentangled attention (DeBERTa-v2), bottlenecks and
    NoNorm (MobileBERT), convolutions beside attention (ConvBERT), norms with a +1 weight and GeGLU (Gemma),
    parallel multi-query attention (Falcon), ALiBi (BLOOM, MPT), learned offset positions (OPT), interleaved
    rotary (GPT-J, CodeGen), sinusoidal positions (XLM, Marian, Pegasus), a convolutional feature extractor with
    GroupNorm and a grouped positional convolution (wav2vec2, HuBERT), quick_gelu (CLIP), image encoders
    (SegFormer's reduced attention, Swin's shifted windows, MobileViT, ConvNeXt and ConvNeXt-v2's GRN), a
    pre-norm encoder (mBART) and a whole encoder-decoder (T5)."""
    hidden, layers, heads, inter, vocab = size.hidden, size.layers, size.heads, size.intermediate, size.vocab
    head_dim = hidden // heads
    decoder = {"bos_token_id": 0, "eos_token_id": 0, "use_cache": False}
    wav2vec2 = {"vocab_size": 32, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                "intermediate_size": inter, "conv_dim": (32, 32, 32), "conv_stride": (5, 2, 2),
                "conv_kernel": (10, 3, 3), "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}
    return {
        "deberta_v2": Export("DebertaV2Config", "DebertaV2Model",
                             {**bert_like, "relative_attention": True, "position_buckets": 32,
                              "max_relative_positions": 64, "pos_att_type": ["p2c", "c2p"], "norm_rel_ebd": "layer_norm",
                              "share_att_key": True, "position_biased_input": False}),
        "electra": Export("ElectraConfig", "ElectraModel", {**bert_like, "embedding_size": hidden // 2}),
        "mobilebert": Export("MobileBertConfig", "MobileBertModel",
                             {**bert_like, "embedding_size": hidden // 2, "intra_bottleneck_size": hidden // 2,
                              "num_feedforward_networks": 2, "normalization_type": "no_norm"}),
        "convbert": Export("ConvBertConfig", "ConvBertModel",
                           {**bert_like, "embedding_size": hidden, "head_ratio": 2, "conv_kernel_size": 9,
                            "num_groups": 1}),
        "xlm": Export("XLMConfig", "XLMModel",
                      {"vocab_size": vocab, "emb_dim": hidden, "n_layers": layers, "n_heads": heads,
                       "max_position_embeddings": 64, "sinusoidal_embeddings": True, "n_langs": 1,
                       "use_lang_emb": False}),
        "gemma": Export("GemmaConfig", "GemmaModel",
                        {**bert_like, "num_key_value_heads": size.kv_heads, "head_dim": head_dim,
                         "hidden_activation": "gelu_pytorch_tanh", **decoder}, inputs="decoder"),
        "falcon": Export("FalconConfig", "FalconModel",
                         {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
                          "num_attention_heads": heads, "multi_query": True, "parallel_attn": True, "alibi": False,
                          "new_decoder_architecture": False, "max_position_embeddings": 64, **decoder},
                         inputs="decoder"),
        "bloom": Export("BloomConfig", "BloomModel",
                        {"vocab_size": vocab, "hidden_size": hidden, "n_layer": layers, "n_head": heads, **decoder},
                        inputs="decoder"),
        "mpt": Export("MptConfig", "MptModel",
                      {"vocab_size": vocab, "d_model": hidden, "n_heads": heads, "n_layers": layers,
                       "expansion_ratio": 2, "max_seq_len": 64, **decoder}, inputs="decoder"),
        "opt": Export("OPTConfig", "OPTModel",
                      {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers, "ffn_dim": inter,
                       "num_attention_heads": heads, "max_position_embeddings": 64, "word_embed_proj_dim": hidden,
                       "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2, "use_cache": False},
                      inputs="decoder"),
        "gptj": Export("GPTJConfig", "GPTJModel",
                       {"vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads, "n_inner": inter,
                        "rotary_dim": head_dim // 2, "n_positions": 64, **decoder}, inputs="decoder"),
        "codegen": Export("CodeGenConfig", "CodeGenModel",
                          {"vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads,
                           "n_inner": inter, "rotary_dim": head_dim // 2, "n_positions": 64, "n_ctx": 64, **decoder},
                          inputs="decoder"),
        "clip_text": Export("CLIPTextConfig", "CLIPTextModel", {**bert_like, "pad_token_id": 1, "bos_token_id": 0,
                                                                 "eos_token_id": 2}),
        "clip_vision": Export("CLIPVisionConfig", "CLIPVisionModel",
                              {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                               "intermediate_size": inter, "image_size": 32, "patch_size": 8}, inputs="image"),
        "segformer": Export("SegformerConfig", "SegformerModel",
                            {"num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1], "hidden_sizes": [32, 64],
                             "patch_sizes": [7, 3], "strides": [4, 2], "num_attention_heads": [1, 2],
                             "mlp_ratios": [4, 4]}, inputs="image"),
        "swin": Export("SwinConfig", "SwinModel",
                       {"image_size": 32, "patch_size": 2, "embed_dim": 16, "depths": [2, 2], "num_heads": [2, 4],
                        "window_size": 4}, inputs="image"),
        "mobilevit": Export("MobileViTConfig", "MobileViTModel",
                            {"image_size": 64, "patch_size": 2, "hidden_sizes": [32, 48, 64],
                             "neck_hidden_sizes": [8, 16, 24, 32, 40, 48, 96], "num_attention_heads": 2},
                            inputs="image", image_size=64),
        "convnext": Export("ConvNextConfig", "ConvNextModel",
                           {"hidden_sizes": [16, 32, 48, 64], "depths": [1, 1, 2, 1], "image_size": 32},
                           inputs="image"),
        "convnextv2": Export("ConvNextV2Config", "ConvNextV2Model",
                             {"hidden_sizes": [16, 32, 48, 64], "depths": [1, 1, 2, 1], "image_size": 32},
                             inputs="image"),
        "wav2vec2": Export("Wav2Vec2Config", "Wav2Vec2Model", wav2vec2, inputs="waveform"),
        "hubert": Export("HubertConfig", "HubertModel",
                         {**wav2vec2, "feat_extract_norm": "layer", "do_stable_layer_norm": True,
                          "conv_bias": True}, inputs="waveform"),
        "marian_encoder": Export("MarianConfig", "MarianModel",
                                 {**seq2seq, "max_position_embeddings": 64, "pad_token_id": 1,
                                  "decoder_start_token_id": 1}, inputs="encoder"),
        "mbart_encoder": Export("MBartConfig", "MBartModel", {**seq2seq, "max_position_embeddings": 64},
                                inputs="encoder"),
        "pegasus_encoder": Export("PegasusConfig", "PegasusModel", {**seq2seq, "max_position_embeddings": 64},
                                  inputs="encoder"),
        "t5": Export("T5Config", "T5Model",
                     {"vocab_size": vocab, "d_model": hidden, "d_kv": head_dim, "d_ff": inter, "num_layers": layers,
                      "num_heads": heads, "feed_forward_proj": "gated-gelu", "decoder_start_token_id": 0,
                      "use_cache": False}, inputs="seq2seq"),
    }


def dynamic_models(size: Size = SIZES["bench"]) -> dict[str, Export]:
    """Decoders exported with a dynamic batch and sequence, as real LLM exports are: their rotary cos and sin
    are computed at run time from the positions (freqs = inv_freq @ positions, cos(cat(freqs, freqs))) instead
    of folded to constants. Llama and Qwen2 rotate half the head, Phi and GPT-NeoX part of it, GPT-J the
    interleaved pairs (rotate_every_two). Traced at batch 2 (torch.export specializes a dim of 1)."""
    static = models(size)
    dynamic = {f"{name}_dynamic": Export(static[name].config, static[name].model, static[name].settings,
                                         inputs="decoder", dynamic=True)
               for name in ("llama", "qwen2", "phi", "gpt_neox")}
    dynamic["gptj_dynamic"] = Export(
        "GPTJConfig", "GPTJModel",
        {"vocab_size": size.vocab, "n_embd": size.hidden, "n_layer": size.layers, "n_head": size.heads,
         "n_inner": size.intermediate, "rotary_dim": size.hidden // size.heads // 2, "n_positions": 64,
         "use_cache": False, "bos_token_id": 0, "eos_token_id": 0}, inputs="decoder", dynamic=True)
    return dynamic


def _families(size: Size) -> tuple[dict, dict, dict]:
    """The config settings the third and fifth batches share: BERT-like encoders, Llama-like decoders (with
    the special token ids newer configs want) and ViT-like image encoders."""
    hidden, layers, heads, inter, vocab = size.hidden, size.layers, size.heads, size.intermediate, size.vocab
    bert_like = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
                 "num_attention_heads": heads, "intermediate_size": inter, "max_position_embeddings": 64}
    llama_like = {**bert_like, "num_key_value_heads": size.kv_heads, "use_cache": False, "bos_token_id": 0,
                  "eos_token_id": 0, "pad_token_id": 0}
    vit_like = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                "intermediate_size": inter, "image_size": 32, "patch_size": 8}
    return bert_like, llama_like, vit_like


def third_models(size: Size = SIZES["bench"]) -> dict[str, Export]:
    """The third sweep's batch (2026-11-26): attention variants the others lack (block-sparse and random
    attention, relative attention with pooling, two-stream relative attention, soft-capped logits, QK norms,
    multi-query, windowed attention with decomposed relative positions), detection-token and object-query
    heads, a selective state-space scan, a speech encoder-decoder and a convolutional codec with an LSTM."""
    hidden, layers, heads, inter, vocab = size.hidden, size.layers, size.heads, size.intermediate, size.vocab
    head_dim = hidden // heads
    bert_like, llama_like, vit_like = _families(size)
    return {
        "dinov2": Export("Dinov2Config", "Dinov2Model", {**vit_like, "layerscale_value": 0.1}, inputs="image"),
        "yolos": Export("YolosConfig", "YolosModel", {**vit_like, "image_size": [32, 32], "num_detection_tokens": 10},
                        inputs="image"),
        "detr": Export("DetrConfig", "DetrModel",
                       {"use_timm_backbone": False, "use_pretrained_backbone": False,
                        "backbone_config": {"model_type": "resnet", "embedding_size": 16, "hidden_sizes": [16, 32],
                                            "depths": [1, 1], "layer_type": "basic", "out_features": ["stage2"]},
                        "d_model": hidden, "encoder_layers": layers, "decoder_layers": layers,
                        "encoder_attention_heads": heads, "decoder_attention_heads": heads,
                        "encoder_ffn_dim": inter, "decoder_ffn_dim": inter, "num_queries": 10},
                       inputs="image", image_size=64),
        "sam_vision": Export("SamVisionConfig", "SamVisionModel",
                             {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                              "mlp_dim": inter, "image_size": 64, "patch_size": 8, "output_channels": 32,
                              "window_size": 4, "global_attn_indexes": [1]}, inputs="image", image_size=64),
        "levit": Export("LevitConfig", "LevitModel",
                        {"image_size": 64, "hidden_sizes": [32, 48, 64], "num_attention_heads": [1, 2, 4],
                         "depths": [1, 1, 1], "key_dim": [8, 8, 8], "patch_size": 16},
                        inputs="image", image_size=64),
        "funnel": Export("FunnelConfig", "FunnelBaseModel",
                         {"vocab_size": vocab, "block_sizes": [1, 1, 1], "d_model": hidden, "n_head": heads,
                          "d_head": head_dim, "d_inner": inter}),
        "big_bird": Export("BigBirdConfig", "BigBirdModel",
                           {**bert_like, "attention_type": "block_sparse", "block_size": 2,
                            "num_random_blocks": 1}),
        "xlnet": Export("XLNetConfig", "XLNetModel",
                        {"vocab_size": vocab, "d_model": hidden, "n_layer": layers, "n_head": heads,
                         "d_inner": inter, "use_mems_eval": False}),
        "gpt_bigcode": Export("GPTBigCodeConfig", "GPTBigCodeModel",
                              {"vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads,
                               "n_inner": inter, "n_positions": 64, "multi_query": True, "use_cache": False,
                               "bos_token_id": 0, "eos_token_id": 0}, inputs="decoder"),
        "stablelm": Export("StableLmConfig", "StableLmModel", llama_like, inputs="decoder"),
        "olmo": Export("OlmoConfig", "OlmoModel", llama_like, inputs="decoder"),
        "phi3": Export("Phi3Config", "Phi3Model", llama_like, inputs="decoder"),
        "qwen3": Export("Qwen3Config", "Qwen3Model", {**llama_like, "head_dim": head_dim}, inputs="decoder"),
        "gemma2": Export("Gemma2Config", "Gemma2Model",
                         {**llama_like, "head_dim": head_dim, "attn_logit_softcapping": 50.0,
                          "sliding_window": 8, "query_pre_attn_scalar": head_dim}, inputs="decoder"),
        "mamba": Export("MambaConfig", "MambaModel",
                        {"vocab_size": vocab, "hidden_size": hidden, "state_size": 8, "num_hidden_layers": layers,
                         "expand": 2, "conv_kernel": 4, "use_cache": False}, inputs="causal"),
        "speech2text": Export("Speech2TextConfig", "Speech2TextModel",
                              {"vocab_size": vocab, "d_model": hidden, "encoder_layers": layers,
                               "decoder_layers": layers, "encoder_attention_heads": heads,
                               "decoder_attention_heads": heads, "encoder_ffn_dim": inter, "decoder_ffn_dim": inter,
                               "max_source_positions": 64, "max_target_positions": 64,
                               "input_feat_per_channel": 80, "conv_channels": 32, "decoder_start_token_id": 2},
                              inputs="speech_seq2seq"),
        "encodec": Export("EncodecConfig", "EncodecModel",
                          {"num_filters": 8, "hidden_size": 32, "upsampling_ratios": [8, 4], "codebook_size": 64,
                           "codebook_dim": 32, "num_lstm_layers": 1, "target_bandwidths": [3.0],
                           "sampling_rate": 8000}, inputs="codec", output="audio_values"),
    }


def fourth_models(size: Size = SIZES["bench"]) -> dict[str, Export]:
    """The fourth sweep's batch (2026-11-25): encoders with other position schemes (DeBERTa's disentangled
    attention, RoFormer's rotary encoder, MPNet's relative buckets, ESM's rotary with token dropout), attention
    replaced (FNet's Fourier transform, SqueezeBERT's grouped 1x1 convolutions, Longformer's sliding windows,
    CANINE's character hashing and downsampling), decoders with local attention (GPT-Neo), a parallel block
    without LayerNorm bias (Cohere), experts routed per token (Mixtral), speech encoders with gated relative
    position bias (WavLM) and a conformer (wav2vec2-conformer), divided space-time video attention
    (TimeSformer), a super-resolution Swin-v2 (Swin2SR) and a dynamic batch and sequence encoder."""
    hidden, layers, heads, inter, vocab = size.hidden, size.layers, size.heads, size.intermediate, size.vocab
    bert_like = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
                 "num_attention_heads": heads, "intermediate_size": inter, "max_position_embeddings": 64}
    llama_like = {**bert_like, "num_key_value_heads": size.kv_heads, "use_cache": False, "bos_token_id": 0,
                  "eos_token_id": 0, "pad_token_id": 0}
    wav2vec2 = {"vocab_size": 32, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                "intermediate_size": inter, "conv_dim": (32, 32, 32), "conv_stride": (5, 2, 2),
                "conv_kernel": (10, 3, 3), "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}
    return {
        "deberta": Export("DebertaConfig", "DebertaModel",
                          {**bert_like, "relative_attention": True, "pos_att_type": ["c2p", "p2c"],
                           "max_relative_positions": 64, "position_biased_input": False}),
        "roformer": Export("RoFormerConfig", "RoFormerModel", {**bert_like, "embedding_size": hidden}),
        "roformer_dynamic": Export("RoFormerConfig", "RoFormerModel", {**bert_like, "embedding_size": hidden},
                                   dynamic=True),
        "mpnet": Export("MPNetConfig", "MPNetModel", {**bert_like, "relative_attention_num_buckets": 32,
                                                      "pad_token_id": 1}),
        "esm": Export("EsmConfig", "EsmModel", {**bert_like, "position_embedding_type": "rotary",
                                                "pad_token_id": 1, "mask_token_id": 2, "token_dropout": True}),
        "fnet": Export("FNetConfig", "FNetModel", {**bert_like, "use_tpu_fourier_optimizations": False,
                                                   "pad_token_id": 1}),
        "squeezebert": Export("SqueezeBertConfig", "SqueezeBertModel", {**bert_like, "embedding_size": hidden}),
        "longformer": Export("LongformerConfig", "LongformerModel",
                             {**bert_like, "attention_window": [4] * layers, "pad_token_id": 1}),
        "canine": Export("CanineConfig", "CanineModel",
                         {**{k: v for k, v in bert_like.items() if k != "vocab_size"},
                          "max_position_embeddings": 256, "num_hash_buckets": 512, "downsampling_rate": 4,
                          "local_transformer_stride": 8}),
        "gpt_neo": Export("GPTNeoConfig", "GPTNeoModel",
                          {"vocab_size": vocab, "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
                           "intermediate_size": inter, "max_position_embeddings": 64, "window_size": 8,
                           "attention_types": [[["global", "local"], layers // 2]], "use_cache": False,
                           "bos_token_id": 0, "eos_token_id": 0}, inputs="decoder"),
        "cohere": Export("CohereConfig", "CohereModel", llama_like, inputs="decoder"),
        "mixtral": Export("MixtralConfig", "MixtralModel",
                          {**llama_like, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None,
                           "experts_implementation": "eager"},  # the loop over experts, not torch._grouped_mm
                          inputs="decoder"),
        "wavlm": Export("WavLMConfig", "WavLMModel", {**wav2vec2, "num_buckets": 32, "max_bucket_distance": 64},
                        inputs="waveform"),
        "wav2vec2_conformer": Export("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel",
                                     {**wav2vec2, "position_embeddings_type": "rotary",
                                      "conv_depthwise_kernel_size": 7}, inputs="waveform"),
        "timesformer": Export("TimesformerConfig", "TimesformerModel",
                              {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                               "intermediate_size": inter, "image_size": 32, "patch_size": 8, "num_frames": 4},
                              inputs="video"),
        "swin2sr": Export("Swin2SRConfig", "Swin2SRModel",
                          {"image_size": 32, "patch_size": 1, "embed_dim": 16, "depths": [2, 2],
                           "num_heads": [2, 2], "window_size": 4, "upscale": 2}, inputs="image"),
    }


def fifth_models(size: Size = SIZES["bench"]) -> dict[str, Export]:
    """The fifth sweep's batch (2026-12-02): encoders with alternating local / global attention (ModernBERT),
    transient-global attention (LongT5), LSH and chunked local attention (Reformer), landmark and hashed
    approximations of softmax attention (Nystromformer, YOSO), latent cross-attention (Perceiver), 2-D layout
    positions (LayoutLMv3, LiLT); decoders with scaled residuals (Granite), biased LayerNorm and sliding windows
    (Starcoder2), local / global layers with QK norms (Gemma3), routed experts with a shared expert
    (Qwen2-MoE), with QK norms (OLMoE) and top-1 with capacity (Switch Transformers); recurrences (the RG-LRU of
    RecurrentGemma, FalconMamba's normalized selective scan); patched time series (PatchTST); a dense depth
    head (DPT); image encoders with attention pooling (SigLIP) and relative position bias with mean pooling
    (BEiT); speech encoders that squeeze the sequence (SEW) and stack positional convolutions (Data2Vec-audio)."""
    hidden, layers, heads, inter, vocab = size.hidden, size.layers, size.heads, size.intermediate, size.vocab
    head_dim = hidden // heads
    bert_like, llama_like, vit_like = _families(size)
    wav2vec2 = {"vocab_size": 32, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                "intermediate_size": inter, "conv_dim": (32, 32, 32), "conv_stride": (5, 2, 2),
                "conv_kernel": (10, 3, 3), "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}
    t5_like = {"vocab_size": vocab, "d_model": hidden, "d_kv": head_dim, "d_ff": inter, "num_layers": layers,
               "num_heads": heads, "use_cache": False}
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "eager"}
    return {
        "modernbert": Export("ModernBertConfig", "ModernBertModel",
                             {**bert_like, "layer_types": ["full_attention", "sliding_attention"],
                              "local_attention": 8,
                              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
                              "sep_token_id": 2}),
        "longt5_encoder": Export("LongT5Config", "LongT5EncoderModel",
                                 {**t5_like, "encoder_attention_type": "transient-global", "local_radius": 4,
                                  "global_block_size": 4}),
        "reformer": Export("ReformerConfig", "ReformerModel",
                           {"vocab_size": vocab, "hidden_size": hidden, "num_attention_heads": heads,
                            "attention_head_size": head_dim, "feed_forward_size": inter,
                            "attn_layers": ["local", "lsh"], "axial_pos_shape": [4, 4],
                            "axial_pos_embds_dim": [hidden // 2, hidden // 2], "max_position_embeddings": 16,
                            "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8, "num_buckets": 2,
                            "num_hashes": 1, "hash_seed": 0, "is_decoder": False, "pad_token_id": 0}),
        "nystromformer": Export("NystromformerConfig", "NystromformerModel",
                                {**bert_like, "segment_means_seq_len": SEQUENCE, "num_landmarks": 4,
                                 "conv_kernel_size": 3, "pad_token_id": 1},
                                inputs="causal"),  # input_ids alone: the exporters trip on its mask
        "yoso": Export("YosoConfig", "YosoModel",
                       {**bert_like, "use_expectation": True, "use_fast_hash": False, "hash_code_len": 9,
                        "pad_token_id": 1}),
        "perceiver": Export("PerceiverConfig", "PerceiverModel",
                            {"num_latents": 8, "d_latents": hidden, "d_model": 32, "num_blocks": 1,
                             "num_self_attends_per_block": layers, "num_self_attention_heads": heads,
                             "num_cross_attention_heads": 1}, inputs="embeds"),
        "layoutlmv3": Export("LayoutLMv3Config", "LayoutLMv3Model",
                             {**bert_like, "coordinate_size": hidden * 3 // 16, "shape_size": hidden // 8,
                              "has_relative_attention_bias": True, "has_spatial_attention_bias": True,
                              "visual_embed": False, "max_2d_position_embeddings": 128, "pad_token_id": 1},
                             inputs="layout"),
        # hidden 96: its layout stream (hidden / 4) is split six ways
        "lilt": Export("LiltConfig", "LiltModel", {**bert_like, "hidden_size": 96, "channel_shrink_ratio": 4,
                                                   "max_2d_position_embeddings": 128, "pad_token_id": 1},
                       inputs="layout"),
        "granite": Export("GraniteConfig", "GraniteModel",
                          {**llama_like, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                           "attention_multiplier": 0.0078125, "logits_scaling": 8.0}, inputs="decoder"),
        "starcoder2": Export("Starcoder2Config", "Starcoder2Model",
                             {**llama_like, "sliding_window": 8, "use_bias": True}, inputs="decoder"),
        "gemma3": Export("Gemma3TextConfig", "Gemma3TextModel",
                         {**llama_like, "head_dim": head_dim, "sliding_window": 8, "query_pre_attn_scalar": head_dim,
                          "layer_types": ["sliding_attention", "full_attention"]}, inputs="decoder"),
        "qwen2_moe": Export("Qwen2MoeConfig", "Qwen2MoeModel",
                            {**llama_like, **moe, "moe_intermediate_size": inter // 2,
                             "shared_expert_intermediate_size": inter, "decoder_sparse_step": 1},
                            inputs="decoder"),
        "olmoe": Export("OlmoeConfig", "OlmoeModel", {**llama_like, **moe}, inputs="decoder"),
        "switch_transformers": Export("SwitchTransformersConfig", "SwitchTransformersEncoderModel",
                                      {**t5_like, "num_sparse_encoder_layers": layers, "num_experts": 4,
                                       "expert_capacity": 8, "num_decoder_layers": layers}),
        "recurrent_gemma": Export("RecurrentGemmaConfig", "RecurrentGemmaModel",
                                  {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": 3,
                                   "num_attention_heads": heads, "num_key_value_heads": 1,
                                   "intermediate_size": inter, "lru_width": hidden, "attention_window_size": 8,
                                   "conv1d_width": 4, "block_types": ["recurrent", "recurrent", "attention"],
                                   "use_cache": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                                  inputs="causal"),
        "falcon_mamba": Export("FalconMambaConfig", "FalconMambaModel",
                               {"vocab_size": vocab, "hidden_size": hidden, "state_size": 8,
                                "num_hidden_layers": layers, "expand": 2, "conv_kernel": 4, "use_cache": False,
                                "use_mambapy": True}, inputs="causal"),
        "patchtst": Export("PatchTSTConfig", "PatchTSTModel",
                           {"num_input_channels": 3, "context_length": 32, "patch_length": 8, "patch_stride": 8,
                            "d_model": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                            "ffn_dim": inter, "scaling": "std"}, inputs="timeseries"),
        "dpt": Export("DPTConfig", "DPTForDepthEstimation",
                      {**vit_like, "num_hidden_layers": 4, "backbone_out_indices": [0, 1, 2, 3],
                       "neck_hidden_sizes": [16, 32, 64, 64], "fusion_hidden_size": 32,
                       "head_in_index": -1}, inputs="image", output="predicted_depth"),
        "siglip_vision": Export("SiglipVisionConfig", "SiglipVisionModel", vit_like, inputs="image",
                                output="pooler_output"),
        "beit": Export("BeitConfig", "BeitModel",
                       {**vit_like, "use_relative_position_bias": True, "use_mean_pooling": True,
                        "layer_scale_init_value": 0.1}, inputs="image", output="pooler_output"),
        "sew": Export("SEWConfig", "SEWModel", {**wav2vec2, "squeeze_factor": 2}, inputs="waveform"),
        "data2vec_audio": Export("Data2VecAudioConfig", "Data2VecAudioModel",
                                 {**wav2vec2, "num_conv_pos_embeddings": 5, "conv_pos_kernel_size": 5},
                                 inputs="waveform"),
    }


def sixth_models(size: Size = SIZES["bench"]) -> dict[str, Export]:
    """The sixth sweep's batch (2026-12-02): what users serve, exported as they serve it, with a dynamic batch
    and sequence (text), batch (images) or batch and samples (raw audio): the encoders (BERT-family, MPNet's
    relative buckets, XLM-RoBERTa, T5's and BART's encoders), decoders with and without a cache (GPT-2 with its
    past, Mistral, Gemma, OPT, BLOOM's ALiBi, Falcon), the Whisper encoder, image encoders (ViT, DeiT's
    distillation token, Swin, ConvNeXt, SegFormer, CLIP) and the convolutional audio front-ends (wav2vec2,
    HuBERT). The static forms of most are in ``models``; what is new is the dims left open."""
    bert_like, llama_like, vit_like = _families(size)
    static = models(size)
    dynamic = {f"{name}_dynamic": Export(static[name].config, static[name].model, static[name].settings,
                                         inputs=static[name].inputs, dynamic=True, past=static[name].past,
                                         image_size=static[name].image_size)
               for name in ("distilbert", "roberta", "albert", "electra", "deberta_v2", "mobilebert", "t5_encoder",
                            "bart_encoder", "clip_text", "gpt2", "gpt2_past", "mistral", "gemma", "opt", "bloom",
                            "falcon", "whisper_encoder", "vit", "swin", "convnext", "segformer", "clip_vision",
                            "wav2vec2", "hubert")}
    return {
        **dynamic,
        "mpnet_dynamic": Export("MPNetConfig", "MPNetModel", {**bert_like, "relative_attention_num_buckets": 32,
                                                               "pad_token_id": 1}, dynamic=True),
        "xlm_roberta_dynamic": Export("XLMRobertaConfig", "XLMRobertaModel", {**bert_like, "pad_token_id": 1},
                                      dynamic=True),
        "deit_dynamic": Export("DeiTConfig", "DeiTModel", vit_like, inputs="image", dynamic=True),
    }


def seventh_models(size: Size = SIZES["bench"]) -> dict[str, Export]:
    """The seventh sweep's batch (2026-12-02): whole encoder-decoders with their decoder (BART at a dynamic batch,
    encoder and decoder lengths apart, Marian, Whisper from mel features), detection transformers past DETR
    (conditional queries, multi-scale deformable attention with grid_sample, RT-DETR's hybrid encoder and
    query selection, Table Transformer), a segmentation head over a backbone's pyramid (UperNet), grouping
    tokens with hard assignment (GroupViT), BLIP's image tower, an audio spectrogram transformer (AST), speech
    encoders with a quantizer-free UniSpeech and SEW-D's disentangled attention, and text models with sinusoidal
    positions computed at run time (XGLM at a dynamic length, CTRL), decoupled embeddings (RemBERT), pre-norm BERT
    (Megatron), multi-resolution attention (MRA), entity-aware attention (LUKE), integer-only BERT in float mode
    (I-BERT) and ERNIE."""
    hidden, layers, heads, inter, vocab = size.hidden, size.layers, size.heads, size.intermediate, size.vocab
    bert_like, llama_like, vit_like = _families(size)
    seq2seq = {"vocab_size": vocab, "d_model": hidden, "encoder_layers": layers, "decoder_layers": layers,
               "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": inter,
               "decoder_ffn_dim": inter, "max_position_embeddings": 64, "use_cache": False}
    wav2vec2 = {"vocab_size": 32, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                "intermediate_size": inter, "conv_dim": (32, 32, 32), "conv_stride": (5, 2, 2),
                "conv_kernel": (10, 3, 3), "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}
    resnet = {"model_type": "resnet", "embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1],
              "layer_type": "basic"}
    detr_like = {"use_timm_backbone": False, "use_pretrained_backbone": False,
                 "backbone_config": {**resnet, "out_features": ["stage2"]}, "d_model": hidden,
                 "encoder_layers": layers, "decoder_layers": layers, "encoder_attention_heads": heads,
                 "decoder_attention_heads": heads, "encoder_ffn_dim": inter, "decoder_ffn_dim": inter,
                 "num_queries": 10}
    marian = {**seq2seq, "pad_token_id": 1, "decoder_start_token_id": 1}
    return {
        "bart": Export("BartConfig", "BartModel", seq2seq, inputs="seq2seq"),
        "bart_dynamic": Export("BartConfig", "BartModel", seq2seq, inputs="seq2seq", dynamic=True),
        "marian_dynamic": Export("MarianConfig", "MarianModel", marian, inputs="seq2seq", dynamic=True),
        "whisper": Export("WhisperConfig", "WhisperModel",
                          {**seq2seq, "num_mel_bins": 80, "max_source_positions": 16, "max_target_positions": 16,
                           "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0, "decoder_start_token_id": 1},
                          inputs="audio_seq2seq"),
        "conditional_detr": Export("ConditionalDetrConfig", "ConditionalDetrModel", detr_like, inputs="image",
                                   image_size=64),
        "table_transformer": Export("TableTransformerConfig", "TableTransformerModel", detr_like, inputs="image",
                                    image_size=64),
        "deformable_detr": Export("DeformableDetrConfig", "DeformableDetrModel",
                                  {**detr_like, "backbone_config": {**resnet, "out_features": ["stage1", "stage2"]},
                                   "num_feature_levels": 2, "encoder_n_points": 2, "decoder_n_points": 2,
                                   "two_stage": False, "with_box_refine": False},
                                  inputs="image", image_size=64),
        "rt_detr": Export("RTDetrConfig", "RTDetrModel",
                          {"use_timm_backbone": False, "use_pretrained_backbone": False,
                           "backbone_config": {"model_type": "rt_detr_resnet", "embedding_size": 16,
                                               "hidden_sizes": [16, 32, 48], "depths": [1, 1, 1],
                                               "layer_type": "basic", "out_features": ["stage1", "stage2", "stage3"]},
                           "encoder_in_channels": [16, 32, 48], "feat_strides": [4, 8, 16], "encode_proj_layers": [2],
                           "d_model": hidden, "encoder_hidden_dim": hidden, "encoder_ffn_dim": inter,
                           "encoder_attention_heads": heads, "encoder_layers": 1, "decoder_layers": layers,
                           "decoder_attention_heads": heads, "decoder_ffn_dim": inter, "decoder_in_channels":
                           [hidden] * 3, "num_queries": 10, "decoder_n_points": 2, "num_feature_levels": 3,
                           "anchor_image_size": None, "num_denoising": 0},
                          inputs="image", image_size=64),
        "upernet": Export("UperNetConfig", "UperNetForSemanticSegmentation",
                          {"backbone_config": {"model_type": "convnext", "hidden_sizes": [16, 32, 48, 64],
                                               "depths": [1, 1, 1, 1],
                                               "out_features": ["stage1", "stage2", "stage3", "stage4"]},
                           "hidden_size": 32, "use_auxiliary_head": False, "num_labels": 5},
                          inputs="image", image_size=64, output="logits"),
        "groupvit_vision": Export("GroupViTVisionConfig", "GroupViTVisionModel",
                                  {"hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
                                   "depths": [1, 1, 1], "num_group_tokens": [8, 4, 0],
                                   "num_output_groups": [8, 4, 4], "image_size": 32, "patch_size": 8},
                                  inputs="image"),
        "blip_vision": Export("BlipVisionConfig", "BlipVisionModel", vit_like, inputs="image"),
        "ast": Export("ASTConfig", "ASTModel",
                      {**{k: v for k, v in vit_like.items() if k not in ("image_size",)}, "patch_size": 8,
                       "frequency_stride": 8, "time_stride": 8, "max_length": 32, "num_mel_bins": 32},
                      inputs="spectrogram"),
        "unispeech_dynamic": Export("UniSpeechConfig", "UniSpeechModel", wav2vec2, inputs="waveform", dynamic=True),
        "sew_d": Export("SEWDConfig", "SEWDModel",
                        {**wav2vec2, "squeeze_factor": 2, "max_position_embeddings": 64, "position_buckets": 16,
                         "share_att_key": True, "relative_attention": True, "pos_att_type": ("p2c", "c2p")},
                        inputs="waveform"),
        "xglm_dynamic": Export("XGLMConfig", "XGLMModel",
                               {"vocab_size": vocab, "d_model": hidden, "num_layers": layers, "attention_heads": heads,
                                "ffn_dim": inter, "max_position_embeddings": 64, "use_cache": False,
                                "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}, inputs="decoder",
                               dynamic=True),
        "ctrl": Export("CTRLConfig", "CTRLModel",
                       {"vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads, "dff": inter,
                        "n_positions": 64, "use_cache": False}, inputs="decoder"),
        "rembert_dynamic": Export("RemBertConfig", "RemBertModel",
                                  {**bert_like, "input_embedding_size": hidden // 2,
                                   "output_embedding_size": hidden, "pad_token_id": 0}, dynamic=True),
        "megatron_bert_dynamic": Export("MegatronBertConfig", "MegatronBertModel", bert_like, dynamic=True),
        "ernie": Export("ErnieConfig", "ErnieModel", {**bert_like, "use_task_id": False}),
        "mra": Export("MraConfig", "MraModel", {**bert_like, "block_per_row": 2, "approx_mode": "full",
                                                "max_position_embeddings": 64 + 2, "pad_token_id": 1}),
        "luke": Export("LukeConfig", "LukeModel", {**bert_like, "entity_vocab_size": 16, "entity_emb_size": 32,
                                                   "pad_token_id": 1}),
        "ibert": Export("IBertConfig", "IBertModel", {**bert_like, "quant_mode": False, "pad_token_id": 1}),
    }


def every_model(size: Size = SIZES["bench"]) -> dict[str, Export]:
    return {**models(size), **dynamic_models(size), **third_models(size), **fourth_models(size),
            **fifth_models(size), **sixth_models(size), **seventh_models(size)}


MODELS = every_model()
DYNAMIC_BATCH = 2


def build(name: str, size: Size = SIZES["bench"]):
    """The model (eval mode, the export's attention implementation) and its inputs."""
    import torch
    import transformers

    spec = every_model(size)[name]
    config = getattr(transformers, spec.config)(**spec.settings)
    config._attn_implementation = spec.attention
    torch.manual_seed(0)
    model = getattr(transformers, spec.model)(config).eval()
    # BatchNorm as the library initializes it (weight ~0.02) shrinks MobileViT's activations to exactly 0 after
    # a few layers: affine parameters and running statistics set around their trained values instead
    stats = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
            for tensor, low, high in ((module.weight, 0.5, 1.5), (module.bias, -0.1, 0.1),
                                      (module.running_mean, -0.1, 0.1), (module.running_var, 0.5, 1.5)):
                tensor.data.copy_(torch.rand(tensor.shape, generator=stats) * (high - low) + low)
    if spec.inputs == "encoder" or spec.inputs == "audio":
        model = model.get_encoder()
    generator = torch.Generator().manual_seed(0)
    batch = DYNAMIC_BATCH if spec.dynamic else 1
    if spec.inputs == "image":
        side = spec.image_size
        return model, {"pixel_values": torch.rand(batch, 3, side, side, generator=generator)}
    if spec.inputs == "waveform":
        return model, {"input_values": torch.randn(batch, 640, generator=generator)}
    if spec.inputs == "video":
        side = spec.image_size
        return model, {"pixel_values": torch.rand(1, config.num_frames, 3, side, side, generator=generator)}
    if spec.inputs == "timeseries":
        return model, {"past_values": torch.randn(1, config.context_length, config.num_input_channels,
                                                  generator=generator)}
    if spec.inputs == "embeds":
        return model, {"inputs": torch.randn(1, SEQUENCE, config.d_model, generator=generator)}
    if spec.inputs == "codec":
        return model, {"input_values": torch.randn(1, 1, 640, generator=generator)}
    if spec.inputs == "speech_seq2seq":
        return model, {"input_features": torch.randn(1, 32, config.input_feat_per_channel, generator=generator),
                       "attention_mask": torch.ones(1, 32, dtype=torch.int64),
                       "decoder_input_ids": torch.randint(3, size.vocab, (1, SEQUENCE // 2), generator=generator)}
    if spec.inputs == "spectrogram":  # AST: (batch, frames, mel bins) log-mel features
        return model, {"input_values": torch.randn(batch, config.max_length, config.num_mel_bins,
                                                   generator=generator)}
    if spec.inputs == "audio_seq2seq":  # Whisper whole: mel features in, the decoder's last hidden state out
        frames = 2 * config.max_source_positions
        return model, {"input_features": torch.rand(batch, config.num_mel_bins, frames, generator=generator),
                       "decoder_input_ids": torch.randint(3, size.vocab, (batch, SEQUENCE // 2),
                                                          generator=generator)}
    if spec.inputs == "audio":
        frames = 2 * config.max_source_positions  # the encoder's two convolutions halve the frames
        return model, {"input_features": torch.rand(batch, config.num_mel_bins, frames, generator=generator)}
    ids = torch.randint(3, size.vocab, (batch, SEQUENCE), generator=generator)
    mask = torch.ones(batch, SEQUENCE + spec.past, dtype=torch.int64)
    inputs = {"input_ids": ids} if spec.inputs == "causal" else {"input_ids": ids, "attention_mask": mask}
    if spec.inputs == "layout":  # word boxes (x0, y0, x1, y1) in [0, 128), x0 <= x1 and y0 <= y1
        corners = torch.randint(0, 64, (batch, SEQUENCE, 2, 2), generator=generator)
        inputs["bbox"] = torch.cat([corners[:, :, 0], corners[:, :, 0] + corners[:, :, 1]], dim=-1)
    if spec.inputs == "seq2seq":
        inputs["decoder_input_ids"] = torch.randint(3, size.vocab, (batch, SEQUENCE // 2), generator=generator)
    kv_heads = getattr(config, "num_key_value_heads", None) or size.heads
    for layer in range(size.layers if spec.past else 0):
        for which in ("key", "value"):
            inputs[f"past_{which}_{layer}"] = torch.randn(batch, kv_heads, spec.past, size.hidden // size.heads,
                                                          generator=generator)
    return model, inputs


def _wrapped(model, names: list[str], output: str = "last_hidden_state"):
    """The model taking its inputs by position and returning its last hidden state (one plain output), then
    the present cache when it is given a past one (inputs past_key_<i>, past_value_<i>, in layer order)."""
    import torch
    import transformers

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            named = dict(zip(names, args))
            past = [named.pop(n) for n in names if n.startswith(("past_key_", "past_value_"))]
            if not past:
                return getattr(self.model(**named, return_dict=True), output)
            cache = transformers.DynamicCache(ddp_cache_data=list(zip(past[0::2], past[1::2])),
                                              config=self.model.config)
            out = self.model(**named, past_key_values=cache, use_cache=True, return_dict=True)
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.last_hidden_state, *present)

    return Wrapped()


def _dynamic_axes(spec: Export, names: list[str]) -> dict | None:
    """A dynamic export's open dims per input and output name: batch and sequence for text (the cache's
    positions and the mask's, sequence + past, named apart), batch alone for images and mel features, batch
    and samples for raw audio."""
    if not spec.dynamic:
        return None
    if spec.inputs in ("image", "audio"):
        axes = {key: {0: "batch"} for key in names}
        return {**axes, "last_hidden_state": {0: "batch"}}
    if spec.inputs == "waveform":
        return {**{key: {0: "batch", 1: "samples"} for key in names}, "last_hidden_state": {0: "batch", 1: "frames"}}
    axes = {key: {0: "batch", 1: "sequence"} for key in names}
    if spec.inputs == "seq2seq":  # the decoder's length is its own; the output is the decoder's
        axes["decoder_input_ids"] = {0: "batch", 1: "decoder_sequence"}
        return {**axes, "last_hidden_state": {0: "batch", 1: "decoder_sequence"}}
    if spec.past:
        axes["attention_mask"] = {0: "batch", 1: "positions"}
        for key in names:
            if key.startswith("past_"):
                axes[key] = {0: "batch", 2: "past"}
                axes[key.replace("past_", "present_")] = {0: "batch", 2: "positions"}
    return {**axes, "last_hidden_state": {0: "batch", 1: "sequence"}}


def output_names(names: list[str]) -> list[str]:
    return ["last_hidden_state", *(n.replace("past_", "present_") for n in names
                                   if n.startswith(("past_key_", "past_value_")))]


def export(name: str, exporter: str, path: Path, size: Size = SIZES["bench"]) -> None:
    import torch

    model, inputs = build(name, size)
    wrapped = _wrapped(model, list(inputs), every_model(size)[name].output)
    args = tuple(inputs.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    axes = _dynamic_axes(every_model(size)[name], list(inputs))
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            # torch.export wants dims, given per argument (the wrapper's one *args parameter); a dim it relates
            # to others (the mask's positions = sequence + past) is left for it to work out (Dim.AUTO)
            named = {"batch": torch.export.Dim("batch", max=64), "sequence": torch.export.Dim("sequence", max=64),
                     "decoder_sequence": torch.export.Dim("decoder_sequence", max=64),
                     "samples": torch.export.Dim("samples", min=400, max=16000)}
            shapes = (tuple({i: named.get(axis, torch.export.Dim.AUTO) for i, axis in axes[key].items()}
                            for key in inputs),) if axes else None
            program = torch.onnx.export(wrapped, args, dynamo=True, input_names=list(inputs),
                                        output_names=output_names(list(inputs)), external_data=False,
                                        dynamic_shapes=shapes)
            program.save(str(path))
        else:
            torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=17, input_names=list(inputs),
                              output_names=output_names(list(inputs)), do_constant_folding=True,
                              dynamic_axes=axes)


def exported(names=None, exporters=EXPORTERS, out: Path = OUT) -> list[Path]:
    """The cached exports that exist, for tests and the benchmark (``models``-marked tests skip without them)."""
    return [path for name in (names or MODELS) for exporter in exporters
            if (path := out / f"{name}.{exporter}.onnx").exists()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(MODELS), help="export this model (repeatable)")
    parser.add_argument("--exporter", action="append", choices=EXPORTERS, help="only this exporter")
    parser.add_argument("--third", action="store_true", help="only the third sweep's batch (third_models)")
    parser.add_argument("--fourth", action="store_true", help="only the fourth sweep's batch (fourth_models)")
    parser.add_argument("--fifth", action="store_true", help="only the fifth sweep's batch (fifth_models)")
    parser.add_argument("--sixth", action="store_true", help="only the sixth sweep's batch (sixth_models)")
    parser.add_argument("--seventh", action="store_true", help="only the seventh sweep's batch (seventh_models)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--size", choices=list(SIZES), default="bench",
                        help="bench: 2 layers, hidden 64 (default); tiny: the committed test fixtures")
    parser.add_argument("--force", action="store_true", help="export again even if the file exists")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(MODELS))
        return 0
    failed = False
    batch = (third_models() if args.third else fourth_models() if args.fourth else fifth_models() if args.fifth
             else sixth_models() if args.sixth else seventh_models() if args.seventh else MODELS)
    for name in args.only or batch:
        for exporter in args.exporter or EXPORTERS:
            path = args.out / f"{name}.{exporter}.onnx"
            failed |= not export_and_report(path, lambda: export(name, exporter, path, SIZES[args.size]),
                                            args.force)
    return 1 if failed else 0


def export_and_report(path: Path, export_it, force: bool) -> bool:
    """Run ``export_it()`` unless ``path`` exists (or ``force``), then print the file's node count and opset,
    or why the export failed (the file removed: one failed export must not hide the others). True if it
    succeeded. Shared by the export scripts of bench/."""
    import onnx

    started = time.perf_counter()
    try:
        if force or not path.exists():
            export_it()
        model = onnx.load(str(path))
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        print(f"{path.name}: {len(model.graph.node)} nodes, opset {opset}, {time.perf_counter() - started:.1f} s",
              flush=True)
        return True
    except Exception as error:  # one failed export must not hide the others
        path.unlink(missing_ok=True)
        message = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        print(f"{path.name}: FAILED ({type(error).__name__}: {message})", flush=True)
        return False


if __name__ == "__main__":
    sys.exit(main())
