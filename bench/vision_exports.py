"""Export torchvision and timm image classifiers (random weights, nothing downloaded) to ONNX with both torch
exporters, then sweep mirserve over them under every place set: the real vision exports mirserve had never
been tried on (the transformer tables cover transformers models only), to find every way it fails on them.

Two steps, in two environments:

- ``export`` (the torch environment, ``/work/bench-env/venv/bin/python``): builds each architecture with
  random weights (``weights=None`` / ``pretrained=False``, ``torch.manual_seed(0)``), BatchNorm running
  statistics set off their defaults (mean in [-0.1, 0.1], variance in [0.5, 1.5]) so that folding works on
  non-trivial values, and exports it with both exporters:

  - ``dynamo``: ``torch.onnx.export(..., dynamo=True)``, the exporter's default opset;
  - ``torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=17)``;
  - ``functions`` (only when asked for, ``--exporter functions``): the TorchScript exporter with
    ``export_modules_as_functions=True``, every module a model-local function whose calls carry its
    attributes (what a model that keeps its functions looks like to mirserve).

  Inputs are small and static (1x3x64x64 for most; the smallest size an architecture accepts otherwise, e.g.
  inception_v3 at 80, maxvit_t and efficientformer_l1 at 224, ViT-style models at a 4x4 patch grid through
  ``image_size`` / ``img_size``; r3d_18 a 1x3x8x32x32 clip), so the whole sweep stays quick. nn.MultiheadAttention's
  inference fast path is turned off (the TorchScript exporter has no symbolic for it). Files are named
  ``<model>.<exporter>.onnx`` in ``--out`` (default ``bench/out/vision``, gitignored; ``--third``: the third
  batch alone, ``THIRD``, with dynamic-axes exports traced at batch 2; ``--fourth``: ``FOURTH``; ``--fifth``: ``FIFTH``; ``--sixth``: ``SIXTH``; ``--seventh``: ``SEVENTH``); an existing
  file is kept
  unless ``--force``. Prints one line per export: its node count or the exporter's one-line reason for
  failing (the run goes on; exit status 1 if any failed).

- ``sweep`` (the project's environment, ``.venv/bin/python``): for every export in ``--out``, runs
  ``mirserve optimize MODEL -o OUT --json`` in a child process (one at a time, ``--timeout`` seconds each,
  default 300) under each configuration of ``CONFIGS``: the default places (``x86/fp32/nchw``), the arm, opencl
  and npu place sets of ``placement_exports.py``, ``--portable``, and ``--opt-level 1 --no-verify`` under
  ``arm/fp16/nhwc,arm/fp32/nchw`` (and ``opencl_L1`` / ``npu_L1`` likewise under the opencl and npu
  place sets; host nodes at level 2 must not exceed level 1's, counted as
  ``placement_exports.host_figures`` does). Records per run the exit status, the error's last line, whether it
  verified and the max abs diff, output nodes, wall seconds, host nodes and casts, and once per model the peers
  (onnxsim, onnxslim, onnxruntime basic and extended, through ``../shared/bench/peers.py`` under
  ``--peers-python``). Results are kept in ``--out``/sweep.json (a run already there is not repeated unless
  ``--force``) so an interrupted sweep resumes; configurations run round by round (every model's default run
  first) so a partial sweep still covers every model. Prints a table (one row per model x exporter) and a list
  of failures (crash, refusal, verification failure, timeout, level 2 worse on host nodes than level 1, more
  nodes than onnxsim or ort-extended at default, warnings of passes that failed soft); exit status 1 when any.

Usage:
    /work/bench-env/venv/bin/python bench/vision_exports.py export [--only NAME ...] [--third | --fourth | --fifth | --sixth | --seventh]
        [--exporter dynamo|torchscript|functions] [--out DIR] [--force] [--list]
    .venv/bin/python bench/vision_exports.py sweep [--only NAME ...] [--third | --fourth | --fifth | --sixth | --seventh] [--exporter ...] [--config NAME ...]
        [--out DIR]
        [--force] [--no-peers] [--timeout S] [--peers-python PY] [--mirserve-tree DIR]
    .venv/bin/python bench/vision_exports.py table [--out DIR]     # the table and failures of sweep.json only
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "vision"
EXPORTERS = ("dynamo", "torchscript")
#: Exporters run only when asked for by name.
EXTRA_EXPORTERS = ("functions",)
PEERS_SCRIPT = REPO.parent / "shared" / "bench" / "peers.py"
if not PEERS_SCRIPT.exists():
    PEERS_SCRIPT = Path("/work/shared/bench/peers.py")
PEERS_PYTHON = Path("/work/peers-env/bin/python")


@dataclass(frozen=True)
class Arch:
    #: "torchvision" or "timm"
    library: str
    #: the builder's name (torchvision.models.<name> or timm.create_model(<name>))
    builder: str
    #: the input's shape
    shape: tuple = (1, 3, 64, 64)
    #: extra keyword arguments of the builder
    kwargs: dict = field(default_factory=dict)
    #: how the model is wrapped to one image in, one tensor out: "" none; "out" its dict's "out" (segmentation);
    #: "pair" a 1x6xHxW input split into two images, the last flow returned (RAFT, 3 updates); "detect" the
    #: image batch as a list, the first image's boxes, scores and labels returned; "keypoints" as "detect" with
    #: the keypoints too; "mask" as "detect" with the masks too; "reparam" timm's reparameterize_model (train-time branches merged, as deployed)
    wrap: str = ""
    #: exported with a dynamic batch and image size (dynamic_axes / dynamic_shapes), traced at batch 2 (a
    #: ViT's batch alone, unless "hw": batch, height and width for every model)
    dynamic: bool | str = False


def _tv(builder, shape=(1, 3, 64, 64), wrap="", dynamic=False, **kwargs):
    return Arch("torchvision", builder, shape, kwargs, wrap, dynamic)


def _timm(builder, shape=(1, 3, 64, 64), wrap="", dynamic=False, **kwargs):
    return Arch("timm", builder, shape, kwargs, wrap, dynamic)


#: name -> architecture. The name is prefixed with its library, the timm ones' builder names kept.
MODELS: dict[str, Arch] = {
    "tv_resnet18": _tv("resnet18"),
    "tv_resnext50_32x4d": _tv("resnext50_32x4d"),
    "tv_wide_resnet50_2": _tv("wide_resnet50_2"),
    "tv_mobilenet_v2": _tv("mobilenet_v2"),
    "tv_mobilenet_v3_large": _tv("mobilenet_v3_large"),
    "tv_efficientnet_b0": _tv("efficientnet_b0"),
    "tv_efficientnet_v2_s": _tv("efficientnet_v2_s"),
    "tv_regnet_y_400mf": _tv("regnet_y_400mf"),
    "tv_convnext_tiny": _tv("convnext_tiny"),
    "tv_shufflenet_v2_x1_0": _tv("shufflenet_v2_x1_0"),
    "tv_squeezenet1_1": _tv("squeezenet1_1"),
    "tv_densenet121": _tv("densenet121"),
    "tv_googlenet": _tv("googlenet", aux_logits=False, init_weights=True),
    "tv_inception_v3": _tv("inception_v3", (1, 3, 80, 80), aux_logits=False, init_weights=True),
    "tv_mnasnet0_5": _tv("mnasnet0_5"),
    "tv_vit_b_16": _tv("vit_b_16", image_size=64),
    "tv_swin_t": _tv("swin_t"),
    "tv_maxvit_t": _tv("maxvit_t", (1, 3, 224, 224)),
    "tv_r3d_18": _tv("video.r3d_18", (1, 3, 8, 32, 32)),
    "timm_resnet50d": _timm("resnet50d"),
    "timm_efficientnet_b0": _timm("efficientnet_b0"),
    "timm_mobilenetv3_large_100": _timm("mobilenetv3_large_100"),
    "timm_ghostnet_100": _timm("ghostnet_100"),
    "timm_rexnet_100": _timm("rexnet_100"),
    "timm_regnetx_002": _timm("regnetx_002"),
    "timm_convnext_atto": _timm("convnext_atto"),
    "timm_vit_tiny_patch16_224": _timm("vit_tiny_patch16_224", img_size=64),
    "timm_deit_tiny_patch16_224": _timm("deit_tiny_patch16_224", img_size=64),
    "timm_levit_128s": _timm("levit_128s", (1, 3, 128, 128), img_size=128),
    "timm_mobilevit_xxs": _timm("mobilevit_xxs"),
    "timm_efficientformerv2_s0": _timm("efficientformerv2_s0", img_size=64),
    "timm_efficientformer_l1": _timm("efficientformer_l1", (1, 3, 224, 224)),  # attention biases fixed at 7x7
    "timm_poolformer_s12": _timm("poolformer_s12"),
    "timm_mixer_s16_224": _timm("mixer_s16_224", img_size=64),
    "timm_cspdarknet53": _timm("cspdarknet53"),
    "timm_cspresnet50": _timm("cspresnet50"),
    "timm_dla34": _timm("dla34"),
    "timm_hrnet_w18_small": _timm("hrnet_w18_small"),
    "timm_coat_tiny": _timm("coat_tiny", img_size=64),
    "timm_coatnet_0_rw_224": _timm("coatnet_0_rw_224", img_size=64),
    "timm_edgenext_xx_small": _timm("edgenext_xx_small"),
    "timm_fastvit_t8": _timm("fastvit_t8"),
    "timm_repvgg_a0": _timm("repvgg_a0"),
    "timm_tinynet_a": _timm("tinynet_a"),
    # --- the second batch: op and shape patterns the first did not cover
    "tv_alexnet": _tv("alexnet"),  # AdaptiveAvgPool 1x1 -> 6x6 at 64x64 (an upsampling adaptive pool)
    "tv_swin_v2_t": _tv("swin_v2_t"),  # cosine attention, continuous position bias MLP
    "tv_fcn_resnet50": _tv("segmentation.fcn_resnet50", wrap="out", weights_backbone=None, aux_loss=False),
    "tv_deeplabv3_mobilenet_v3_large": _tv("segmentation.deeplabv3_mobilenet_v3_large", wrap="out",
                                           weights_backbone=None, aux_loss=False),  # ASPP, dilated, Resize
    "tv_raft_small": _tv("optical_flow.raft_small", (1, 6, 128, 128), wrap="pair"),  # grid_sample, correlation
    "tv_ssdlite320_mobilenet_v3_large": _tv("detection.ssdlite320_mobilenet_v3_large", (1, 3, 320, 320),
                                            wrap="detect", weights_backbone=None),  # NMS, TopK
    "timm_beit_base_patch16_224": _timm("beit_base_patch16_224", img_size=64, depth=4),  # relative pos bias
    "timm_eva02_tiny_patch14_224": _timm("eva02_tiny_patch14_224", (1, 3, 56, 56), img_size=56),  # rotary, SwiGLU
    "timm_volo_d1_224": _timm("volo_d1_224", img_size=64),  # outlook attention: unfold / fold
    "timm_sequencer2d_s": _timm("sequencer2d_s"),  # bidirectional LSTM
    "timm_resnest14d": _timm("resnest14d"),  # split attention, radix softmax
    "timm_eca_nfnet_l0": _timm("eca_nfnet_l0"),  # scaled weight standardization, ECA conv1d
    "timm_efficientvit_b0": _timm("efficientvit_b0"),  # ReLU linear attention
    "timm_pvt_v2_b0": _timm("pvt_v2_b0"),  # spatial-reduction attention
    "timm_xcit_nano_12_p16_224": _timm("xcit_nano_12_p16_224", img_size=64),  # cross-covariance attention
    "timm_cait_xxs24_224": _timm("cait_xxs24_224", img_size=64),  # talking heads, class attention
    "timm_crossvit_tiny_240": _timm("crossvit_tiny_240", (1, 3, 120, 120), img_size=120),  # bicubic resize 120->112
    "timm_focalnet_tiny_srf": _timm("focalnet_tiny_srf"),  # focal modulation
    "timm_gcvit_xxtiny": _timm("gcvit_xxtiny", img_size=64),  # global context attention
    "timm_botnet26t_256": _timm("botnet26t_256", img_size=64),  # relative position logits
    "timm_halonet26t": _timm("halonet26t", (1, 3, 256, 256), img_size=256),  # halo attention (unfold): 8x8 blocks at /32
    "timm_lambda_resnet26t": _timm("lambda_resnet26t", img_size=64),  # lambda layer, Conv3d
    "timm_ghostnetv2_100": _timm("ghostnetv2_100"),  # DFC attention: pool, nearest upsample
    "timm_tnt_s_patch16_224": _timm("tnt_s_patch16_224", img_size=64),  # pixel embedding: nn.Unfold
    "timm_hiera_tiny_224": _timm("hiera_tiny_224", img_size=64),  # mask-unit unroll / reroll
    "timm_tresnet_m": _timm("tresnet_m"),  # space-to-depth, anti-aliased downsampling
}

#: the third batch (2026-11-26): detection postprocess, dynamic input dims, video, reparameterized blocks,
#: families the first two did not cover; `--third` selects it
THIRD: dict[str, Arch] = {
    "tv_mobilenet_v3_small": _tv("mobilenet_v3_small"),
    "tv_regnet_x_400mf": _tv("regnet_x_400mf"),
    "tv_lraspp_mobilenet_v3_large": _tv("segmentation.lraspp_mobilenet_v3_large", wrap="out",
                                        weights_backbone=None),  # sigmoid gate over a global pool, Resize
    "tv_deeplabv3_resnet50": _tv("segmentation.deeplabv3_resnet50", wrap="out", weights_backbone=None,
                                 aux_loss=False),  # dilated ResNet, ASPP
    "tv_fcos_resnet50_fpn": _tv("detection.fcos_resnet50_fpn", (1, 3, 128, 128), wrap="detect",
                                weights_backbone=None, min_size=128, max_size=128),  # centerness, topk, NMS
    "tv_keypointrcnn_resnet50_fpn": _tv("detection.keypointrcnn_resnet50_fpn", (1, 3, 128, 128),
                                        wrap="keypoints", weights_backbone=None, min_size=128, max_size=128),
    "tv_s3d": _tv("video.s3d", (1, 3, 16, 224, 224)),  # separable 3D convolutions; a fixed 2x7x7 final pool
    "tv_mvit_v2_s": _tv("video.mvit_v2_s", (1, 3, 16, 224, 224)),  # pooled attention, rel. pos, fixed size
    "tv_vit_b_16_dynamic": _tv("vit_b_16", (2, 3, 64, 64), dynamic=True, image_size=64),  # batch dynamic
    "tv_resnet18_dynamic": _tv("resnet18", (2, 3, 64, 64), dynamic=True),  # batch, height, width dynamic
    "timm_nest_tiny": _timm("nest_tiny", img_size=64),  # nested blocks, block aggregation
    "timm_twins_svt_small": _timm("twins_svt_small"),  # locally-grouped + global sub-sampled attention
    "timm_convmixer_768_32": _timm("convmixer_768_32"),  # depthwise 7x7 GELU mixer, residuals
    "timm_visformer_tiny": _timm("visformer_tiny", (1, 3, 224, 224)),  # conv + attention stages, BN in attn
    "timm_res2net50_26w_4s": _timm("res2net50_26w_4s"),  # hierarchical splits, Split + Concat per block
    "timm_selecsls42b": _timm("selecsls42b"),  # selective concatenation
    "timm_dpn68": _timm("dpn68"),  # dual paths: Slice + Add + Concat
    "timm_inception_next_tiny": _timm("inception_next_tiny"),  # band depthwise kernels on channel splits
    "timm_mambaout_femto": _timm("mambaout_femto"),  # gated CNN blocks, NHWC linear
    "timm_fastvit_t8_reparam": _timm("fastvit_t8", wrap="reparam"),  # as deployed: branches merged
    "timm_mobileone_s0_reparam": _timm("mobileone_s0", wrap="reparam"),
    "timm_vit_tiny_dynamic": _timm("vit_tiny_patch16_224", (2, 3, 64, 64), dynamic=True, img_size=64),
}
MODELS.update(THIRD)

#: the fourth batch (2026-11-25): families none of the first three had (video (2+1)D and 3-D windows, a
#: GroupNorm detector head, pooling ViTs, metaformers, mobile attention variants, TF "SAME" padding with a
#: dynamic image size, partial and selective convolutions); `--fourth` selects it
FOURTH: dict[str, Arch] = {
    "tv_r2plus1d_18": _tv("video.r2plus1d_18", (1, 3, 8, 32, 32)),  # (2+1)D factorized convolutions
    "tv_swin3d_t": _tv("video.swin3d_t", (1, 3, 8, 64, 64)),  # 3-D shifted windows, padded to the window
    "tv_retinanet_resnet50_fpn_v2": _tv("detection.retinanet_resnet50_fpn_v2", (1, 3, 128, 128), wrap="detect",
                                        weights_backbone=None, min_size=128, max_size=128),  # GroupNorm heads
    "timm_pit_ti_224": _timm("pit_ti_224", img_size=64),  # pooling ViT: tokens reshaped, strided depthwise conv
    "timm_repvit_m0_9_reparam": _timm("repvit_m0_9", wrap="reparam"),  # RepViT as deployed
    "timm_tiny_vit_5m_224": _timm("tiny_vit_5m_224"),  # windowed attention with attention biases, padded
    "timm_mobilevitv2_050": _timm("mobilevitv2_050"),  # separable (linear) self-attention
    "timm_davit_tiny": _timm("davit_tiny"),  # channel attention alternating with window attention
    "timm_maxvit_nano_rw_256": _timm("maxvit_nano_rw_256", img_size=64),  # block + grid attention, rel. bias
    "timm_caformer_s18": _timm("caformer_s18"),  # metaformer: StarReLU, scale layers, attention stages
    "timm_mobilenetv4_hybrid_medium": _timm("mobilenetv4_hybrid_medium"),  # mobile multi-query attention
    "timm_hgnetv2_b0": _timm("hgnetv2_b0"),  # PP-HGNetV2: learnable affine blocks, light convs, concat
    "timm_efficientvit_m0": _timm("efficientvit_m0", img_size=64),  # cascaded group attention (MSRA)
    "timm_starnet_s1": _timm("starnet_s1"),  # star operation: elementwise product of two branches
    "timm_swiftformer_xs": _timm("swiftformer_xs"),  # efficient additive attention
    "timm_convit_tiny": _timm("convit_tiny", img_size=64),  # gated positional self-attention
    "timm_mixnet_s": _timm("mixnet_s"),  # mixed depthwise kernel sizes on channel splits
    "timm_resmlp_12_224": _timm("resmlp_12_224", img_size=64),  # affine normalization, token-mixing MLP
    "timm_ghostnetv3_100": _timm("ghostnetv3_100"),  # GhostNetV3 (re-parameterizable branches, unmerged)
    "timm_fasternet_t0": _timm("fasternet_t0"),  # partial convolution: a conv on a channel slice
    "timm_skresnet18": _timm("skresnet18"),  # selective kernel: softmax over two branches
    "timm_tf_efficientnet_lite0_dynamic": _timm("tf_efficientnet_lite0", (2, 3, 64, 64), dynamic=True),  # SAME
}
MODELS.update(FOURTH)


#: the fifth batch (2026-12-02): families none of the first four had (inception-ResNet and inception-v4 blocks,
#: weight-standardized GroupNorm ResNets, one-shot aggregation, spatial gating MLPs, multi-scale pooled attention,
#: SSD's VGG with L2 norm, a two-stage detector's RoI heads, a post-training quantized network); `--fifth`
FIFTH: dict[str, Arch] = {
    "timm_inception_v4": _timm("inception_v4", (1, 3, 80, 80)),  # inception-A/B/C with 1x7 / 7x1 factorized convs
    "timm_inception_resnet_v2": _timm("inception_resnet_v2", (1, 3, 80, 80)),  # scaled residual inception blocks
    "timm_xception41": _timm("xception41"),  # aligned Xception: separable convs, strided residual 1x1 shortcuts
    "timm_resnetv2_50x1_bit": _timm("resnetv2_50x1_bit"),  # BiT: GroupNorm + weight standardization at run time
    "timm_regnetz_b16": _timm("regnetz_b16"),  # RegNetZ: SE in inverted bottlenecks, group width 16
    "timm_ese_vovnet19b_dw": _timm("ese_vovnet19b_dw"),  # one-shot aggregation: concat of every layer, eSE gate
    "timm_lcnet_050": _timm("lcnet_050"),  # PP-LCNet: hard-swish, 5x5 depthwise, SE late only
    "timm_hardcorenas_a": _timm("hardcorenas_a"),  # NAS blocks with hard-sigmoid SE
    "timm_gernet_s": _timm("gernet_s"),  # GENet: mixed basic / bottleneck / depthwise stages (ByobNet)
    "timm_deit3_small_patch16_224": _timm("deit3_small_patch16_224", img_size=64),  # layer scale, no distill token
    "timm_flexivit_small": _timm("flexivit_small", img_size=64),  # ViT with a resampled patch embedding
    "timm_vit_relpos_small_patch16_224": _timm("vit_relpos_small_patch16_224", img_size=64),  # rel. pos MLP bias
    "timm_gmlp_s16_224": _timm("gmlp_s16_224", img_size=64),  # gMLP: spatial gating unit (token-mixing linear)
    "timm_convformer_s18": _timm("convformer_s18"),  # metaformer with separable-conv token mixer, StarReLU
    "timm_levit_conv_128s": _timm("levit_conv_128s", (1, 3, 128, 128), img_size=128),  # LeViT as 1x1 convs
    "timm_mvitv2_tiny": _timm("mvitv2_tiny", img_size=64),  # pooled multi-scale attention, rel. pos, residual pool
    "timm_nextvit_small": _timm("nextvit_small"),  # Next-ViT: multi-head conv attention + E-MHSA with avg pool
    "timm_sebotnet33ts_256": _timm("sebotnet33ts_256", img_size=64),  # SE + bottleneck self-attention, rel. logits
    "timm_fastvit_mci0": _timm("fastvit_mci0"),  # MobileCLIP image tower: reparam conv stem, attention stages
    "tv_vgg11_bn": _tv("vgg11_bn"),  # VGG: plain conv/BN/ReLU stack, 7x7 adaptive pool upsampling at 64x64
    "tv_mc3_18": _tv("video.mc3_18", (1, 3, 8, 32, 32)),  # mixed 3-D then 2-D (1x3x3) convolutions
    "tv_ssd300_vgg16": _tv("detection.ssd300_vgg16", (1, 3, 300, 300), wrap="detect",
                           weights_backbone=None),  # L2-normalized VGG features, default boxes, NMS
    "tv_fasterrcnn_mobilenet_v3_large_320_fpn": _tv("detection.fasterrcnn_mobilenet_v3_large_320_fpn",
                                                    (1, 3, 320, 320), wrap="detect", weights_backbone=None),
    # post-training quantized (fbgemm): quantized ops, a class never tried. Without weights torchvision's
    # observers never run, so every activation has scale 1 and zero point 0: the graph is real, not its values
    "tv_quantized_mobilenet_v3_large": _tv("quantization.mobilenet_v3_large", quantize=True),
    "tv_quantized_resnet18": _tv("quantization.resnet18", quantize=True),
}
MODELS.update(FIFTH)


#: the sixth batch (2026-12-02): what users export most and what none of the first five had: the timm and
#: torchvision defaults at a dynamic batch and image size (drop path kept in, as a training checkpoint is),
#: normalization-free nets (scaled weight standardization, no BatchNorm), global response normalization,
#: cross-stage partial darknets, a ViT whose position embedding is resampled at run time (dynamic_img_size),
#: distillation tokens, attention-pooled heads, single-head and vision-transformer hybrids; `--sixth`
SIXTH: dict[str, Arch] = {
    "timm_convnextv2_atto": _timm("convnextv2_atto"),  # global response normalization (GRN)
    "timm_efficientnet_b0_drop_path_dynamic": _timm("efficientnet_b0", (2, 3, 64, 64), dynamic=True,
                                                    drop_path_rate=0.2),  # stochastic depth, identity in eval
    "timm_regnety_002_dynamic": _timm("regnety_002", (2, 3, 64, 64), dynamic=True),  # SE, batch/H/W dynamic
    "timm_nf_regnet_b0": _timm("nf_regnet_b0"),  # normalization-free: scaled weight standardization, no BN
    "timm_dm_nfnet_f0": _timm("dm_nfnet_f0"),  # NFNet: ScaledStdConv2dSame, GELU gain, skip gain
    "timm_nf_resnet26": _timm("nf_resnet26"),  # NF-ResNet
    "timm_cs3darknet_s": _timm("cs3darknet_s"),  # cross-stage partial darknet (YOLO backbones)
    "timm_vit_small_dynimg": _timm("vit_small_patch16_224", (2, 3, 64, 64), dynamic="hw", img_size=64,
                                   dynamic_img_size=True, depth=4),  # position embedding resampled at run time
    "timm_deit_tiny_distilled": _timm("deit_tiny_distilled_patch16_224", img_size=64),  # class + distill tokens
    "timm_vit_pe_core_tiny": _timm("vit_pe_core_tiny_patch16_384", img_size=64),  # EVA-style rotary, attn pool
    "timm_vit_base_siglip": _timm("vit_base_patch16_siglip_224", img_size=64, depth=2),  # MAP attention-pool head
    "timm_rdnet_tiny": _timm("rdnet_tiny"),  # revived DenseNet: concat-growth blocks, LayerNorm, transitions
    "timm_vitamin_small": _timm("vitamin_small_224", (1, 3, 224, 224)),  # MBConv stages, then ViT stage
    "timm_hgnet_tiny": _timm("hgnet_tiny"),  # PP-HGNet (v1): ESE, concat aggregation
    "timm_efficientvit_l1": _timm("efficientvit_l1"),  # MIT EfficientViT-L: GELU, ReLU linear attention
    "timm_shvit_s1": _timm("shvit_s1", (1, 3, 224, 224)),  # single-head attention on a channel part
    "timm_seresnext26d_32x4d": _timm("seresnext26d_32x4d"),  # grouped convs, SE, deep stem, avg-pool down
    "timm_rexnetr_100": _timm("rexnetr_100"),  # ReXNet with rounded channels, SiLU / ReLU6, partial residual
    "timm_mobilenetv4_conv_small_dynamic": _timm("mobilenetv4_conv_small", (2, 3, 64, 64), dynamic=True),
    "timm_darknet53": _timm("darknet53"),  # plain darknet residuals, LeakyReLU
    "tv_regnet_y_800mf": _tv("regnet_y_800mf"),
    "tv_efficientnet_b3": _tv("efficientnet_b3"),
    "tv_resnet50_dynamic": _tv("resnet50", (2, 3, 64, 64), dynamic=True),  # the most exported model
    "tv_vit_b_32_dynamic": _tv("vit_b_32", (2, 3, 64, 64), dynamic=True, image_size=64),
    "tv_swin_v2_s": _tv("swin_v2_s"),
    "tv_mobilenet_v3_large_dynamic": _tv("mobilenet_v3_large", (2, 3, 64, 64), dynamic=True),
    "tv_fcn_resnet50_dynamic": _tv("segmentation.fcn_resnet50", (2, 3, 64, 64), wrap="out", dynamic=True,
                                   weights_backbone=None, aux_loss=False),  # output resized to the input H/W
}
MODELS.update(SIXTH)


#: the seventh batch (2026-12-02): anti-aliased and blur-pooled downsampling, global-context and quad
#: (ByobNet) blocks, deep layer aggregation's trees, HRNet-v2's multi-resolution fusion, 2-D rotary ViTs and
#: register tokens with average pooling, BEiT-v2, CoAtNet with a relative-position MLP, RepGhost as deployed,
#: Mask R-CNN's mask head, and more CNNs at a dynamic batch and image size; `--seventh`
SEVENTH: dict[str, Arch] = {
    "timm_resnetaa50d_dynamic": _timm("resnetaa50d", (2, 3, 64, 64), dynamic=True),  # anti-aliased (blur) pool
    "timm_resnetblur18": _timm("resnetblur18"),  # BlurPool: a fixed depthwise binomial filter, stride 2
    "timm_gcresnet33ts": _timm("gcresnet33ts"),  # global context blocks (attention pooling + channel MLP)
    "timm_resnet51q": _timm("resnet51q"),  # ByobNet quad bottlenecks, SiLU, grouped convs
    "timm_dla46x_c": _timm("dla46x_c"),  # deep layer aggregation: iterative / hierarchical trees
    "timm_hrnet_w18_small_v2": _timm("hrnet_w18_small_v2"),  # parallel resolutions, nearest upsample fusion
    "timm_vit_small_rope": _timm("vit_small_patch16_rope_224", img_size=64, depth=2),  # 2-D axial rotary
    "timm_vit_little_reg_gap": _timm("vit_little_patch16_reg1_gap_256", img_size=64, depth=2),  # register, GAP
    "timm_beitv2_base": _timm("beitv2_base_patch16_224", img_size=64, depth=2),  # BEiT-v2: rel. pos bias, gamma
    "timm_coatnet_rmlp_nano": _timm("coatnet_rmlp_nano_rw_224", img_size=64),  # rel. position MLP bias
    "timm_repghostnet_050_reparam": _timm("repghostnet_050", wrap="reparam"),  # RepGhost as deployed
    "timm_cspresnext50_dynamic": _timm("cspresnext50", (2, 3, 64, 64), dynamic=True),
    "timm_ghostnet_100_dynamic": _timm("ghostnet_100", (2, 3, 64, 64), dynamic=True),  # ghost slice at dyn. size
    "tv_densenet121_dynamic": _tv("densenet121", (2, 3, 64, 64), dynamic=True),  # concat growth, dynamic H/W
    "tv_maskrcnn_resnet50_fpn": _tv("detection.maskrcnn_resnet50_fpn", (1, 3, 128, 128), wrap="mask",
                                    weights_backbone=None, min_size=128, max_size=128),  # RoIAlign, mask paste
}
MODELS.update(SEVENTH)


# --- export (torch environment) -------------------------------------------------------------------------
def build(name: str):
    """The model in eval mode, random weights, BatchNorm statistics off their defaults, and its input."""
    import torch

    spec = MODELS[name]
    torch.manual_seed(0)
    if spec.library == "torchvision":
        import torchvision

        owner = torchvision.models
        *path, last = spec.builder.split(".")
        for part in path:
            owner = getattr(owner, part)
        model = getattr(owner, last)(weights=None, **spec.kwargs)
    else:
        import timm

        model = timm.create_model(spec.builder, pretrained=False, **spec.kwargs)
    model = model.eval()
    for module in model.modules():  # running statistics off their defaults, as a trained model's are
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
        # a zero-initialized classifier (timm's sequencer2d and hiera heads) makes the output all zeros for
        # every input, and verification vacuous: such weights get small random values instead
        if isinstance(module, torch.nn.Linear) and not module.weight.any():
            torch.nn.init.normal_(module.weight, std=0.02)
    image = torch.rand(*spec.shape, generator=torch.Generator().manual_seed(0))
    if spec.wrap == "reparam":
        from timm.utils.model import reparameterize_model

        return reparameterize_model(model).eval(), image
    if spec.wrap:
        model = _Wrapped(model, spec.wrap).eval()
    return model, image


def _Wrapped(model, how: str):
    """``model`` adapted to one image tensor in and tensors out (see ``Arch.wrap``)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, images):
            if how == "out":
                return self.model(images)["out"]
            if how == "pair":
                return self.model(images[:, :3], images[:, 3:], num_flow_updates=3)[-1]
            if how in ("detect", "keypoints", "mask"):
                found = self.model(list(images))[0]
                if how == "mask":
                    return found["boxes"], found["scores"], found["labels"], found["masks"]
                if how == "keypoints":
                    return found["boxes"], found["scores"], found["labels"], found["keypoints"]
                return found["boxes"], found["scores"], found["labels"]
            raise ValueError(how)

    return Wrapped()


def export(name: str, exporter: str, path: Path) -> None:
    import torch

    model, image = build(name)
    # nn.MultiheadAttention's inference fast path (aten::_native_multi_head_attention) has no TorchScript
    # symbolic; with it off both exporters see the composite attention, as users exporting ViTs set it
    torch.backends.mha.set_fastpath_enabled(False)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a dynamic export: batch (and for a CNN height and width) left open, as served models are
    dynamic = MODELS[name].dynamic
    axes = {0: "batch"} if "vit" in name and dynamic != "hw" else {0: "batch", 2: "height", 3: "width"}
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            # an image side from 32 (anti-aliased downsampling guards on a side of at least 15; the ONNX file
            # names the dims, never their range)
            shapes = ({i: torch.export.Dim(axis, min=2 if axis == "batch" else 32, max=1024 if axis != "batch" else 64)
                       for i, axis in axes.items()},) if dynamic else None
            program = torch.onnx.export(model, (image,), dynamo=True, input_names=["images"],
                                        output_names=["logits"], external_data=False, dynamic_shapes=shapes)
            program.save(str(path))
        else:
            torch.onnx.export(model, (image,), str(path), dynamo=False, opset_version=17, input_names=["images"],
                              output_names=["logits"], do_constant_folding=True,
                              dynamic_axes={"images": axes, "logits": {0: "batch"}} if dynamic else None,
                              export_modules_as_functions=exporter == "functions")


def export_all(names, exporters, out: Path, force: bool) -> int:
    sys.path.insert(0, str(REPO / "bench"))
    from transformer_exports import export_and_report

    failed = False
    for name in names:
        for exporter in exporters:
            path = out / f"{name}.{exporter}.onnx"
            failed |= not export_and_report(path, lambda: export(name, exporter, path), force)
    return 1 if failed else 0


# --- sweep (project environment) ------------------------------------------------------------------------
#: configuration name -> mirserve optimize options
CONFIGS = {
    "default": [],
    "arm": ["--places", "arm/fp16/nhwc,arm/fp32/nchw"],
    "portable": ["--portable"],
    # its figure is the host nodes, which verification does not change (the fp16 precision fallback moves nodes
    # between arm places, not to host): without it, as the fp16 runs' fallback search can take a minute each
    "arm_L1": ["--places", "arm/fp16/nhwc,arm/fp32/nchw", "--opt-level", "1", "--no-verify"],
    "npu": ["--places", "npu/int8/nchw,arm/fp32/nchw"],
    "opencl": ["--places", "opencl/fp16/nchw,arm/fp32/nchw"],
    # issue #12's level-1 twins of the opencl and npu place sets (host nodes only, as arm_L1)
    "opencl_L1": ["--places", "opencl/fp16/nchw,arm/fp32/nchw", "--opt-level", "1", "--no-verify"],
    "npu_L1": ["--places", "npu/int8/nchw,arm/fp32/nchw", "--opt-level", "1", "--no-verify"],
}
#: level-2 configuration -> its level-1 twin: host nodes at level 2 must not exceed level 1's
LEVEL_PAIRS = {"arm": "arm_L1", "opencl": "opencl_L1", "npu": "npu_L1"}


def _host_figures(summary: dict) -> dict:
    sys.path.insert(0, str(REPO / "bench"))
    from placement_exports import host_figures

    return host_figures({"summary": summary, "verification": summary.get("verification")})


def run_mirserve(model: Path, config: str, timeout: float, python: Path, tree: Path = REPO) -> dict:
    """One ``mirserve optimize --json`` run in its own child: its figures, or its error. ``tree`` is the
    mirserve source tree run (``python -m app.cli`` in it, so its packages come first on the path)."""
    out = Path("/tmp") / f"vision_sweep.{model.stem}.{config}.onnx"
    command = [str(python), "-m", "app.cli", "optimize", str(model), "-o", str(out), "--json", *CONFIGS[config]]
    started = time.perf_counter()
    try:
        child = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": round(time.perf_counter() - started, 1)}
    finally:
        out.unlink(missing_ok=True)
    result = {"status": child.returncode, "seconds": round(time.perf_counter() - started, 1)}
    try:
        summary = json.loads(child.stdout)
    except ValueError:
        summary = None
    if child.returncode != 0 or summary is None:
        lines = [line for line in (child.stderr or child.stdout).strip().splitlines() if line.strip()]
        result["error"] = (lines[-1] if lines else "?")[:400]
        traceback = [line for line in lines if "Traceback" in line]
        result["traceback"] = bool(traceback)
        if traceback:
            result["stderr_tail"] = "\n".join(lines[-16:])[:3000]
        return result
    verification = summary.get("verification") or {}
    result.update(_host_figures(summary))
    result.update(nodes_before=summary["nodes"]["before"], nodes=summary["nodes"]["after"],
                  verified=verification.get("passed"), skipped=verification.get("skipped"),
                  max_abs_diff=verification.get("max_abs_diff"),
                  warnings=[str(w)[:300] for w in summary.get("warnings") or []])
    return result


def run_peers(model: Path, python: Path, timeout: float) -> dict:
    command = [str(python), str(PEERS_SCRIPT), str(model), "--no-check", "--only", "onnxsim", "--only", "onnxslim",
               "--only", "ort_basic", "--only", "ort_extended"]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=timeout * 2)
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    try:
        rows = json.loads(child.stdout.strip().splitlines()[-1])["rows"]
    except (ValueError, IndexError, KeyError):
        return {"error": ((child.stderr.strip().splitlines() or ["?"])[-1])[:200]}
    return {r["peer"]: r.get("nodes", r.get("error")) for r in rows if r["peer"] != "original"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _save(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True))
    tmp.replace(path)


def sweep(models: list[Path], configs: list[str], out: Path, force: bool, peers: bool, timeout: float,
          python: Path, peers_python: Path, tree: Path = REPO) -> None:
    store = out / "sweep.json"
    results = _load(store)
    for config in configs:  # round by round: every model's default run first
        for model in models:
            key = f"{model.stem}|{config}"
            if key in results and not force:
                continue
            results[key] = run_mirserve(model.resolve(), config, timeout, python, tree)
            _save(store, results)
            print(f"{model.stem:45} {config:9} {_cell(results[key])}", flush=True)
            if config == "default" and peers and (f"{model.stem}|peers" not in results or force):
                results[f"{model.stem}|peers"] = run_peers(model, peers_python, timeout)
                _save(store, results)


def _cell(run: dict | None) -> str:
    if not run:
        return "-"
    if run["status"] == "timeout":
        return "TIMEOUT"
    if "error" in run:
        return "CRASH" if run.get("traceback") else "REFUSED"
    if run.get("verified") is False:
        return f"{run['nodes']}!VERIFY"
    if run.get("verified") is None:
        return f"{run['nodes']}?unverified"
    return str(run["nodes"])


def failures(results: dict) -> list[tuple[str, str, str]]:
    """(export, configuration, what) for each failure in the results."""
    found = []
    models = sorted({key.split("|")[0] for key in results})
    for model in models:
        peers = results.get(f"{model}|peers") or {}
        for config in CONFIGS:
            run = results.get(f"{model}|{config}")
            if not run:
                continue
            if run["status"] == "timeout":
                found.append((model, config, f"timeout after {run['seconds']} s"))
            elif "error" in run:
                kind = "crash" if run.get("traceback") else "refused"
                found.append((model, config, f"{kind} (exit {run['status']}): {run['error']}"))
            else:
                if run.get("verified") is False:
                    found.append((model, config, f"verification failed, max abs diff {run.get('max_abs_diff')}"))
                elif run.get("verified") is None and "--no-verify" not in CONFIGS[config]:
                    found.append((model, config, f"not verified: {run.get('skipped')}"))
                for warning in run.get("warnings") or []:
                    if "by the placement plan" in warning:  # a choice the report explains, not a failure
                        continue
                    found.append((model, config, f"warning: {warning}"))
        for level_two, level_one in LEVEL_PAIRS.items():
            one, two = results.get(f"{model}|{level_one}"), results.get(f"{model}|{level_two}")
            if one and two and "host" in one and "host" in two and two["host"] > one["host"]:
                found.append((model, level_two, f"host nodes at level 2 ({two['host']}) > level 1 ({one['host']})"))
        default = results.get(f"{model}|default") or {}
        if "nodes" in default:
            for peer in ("onnxsim", "ort_extended"):
                if isinstance(peers.get(peer), int) and default["nodes"] > peers[peer]:
                    found.append((model, "default", f"{default['nodes']} nodes > {peer} {peers[peer]}"))
        times = [results[f"{model}|{c}"]["seconds"] for c in CONFIGS if f"{model}|{c}" in results]
        if times and max(times) > 60:
            found.append((model, "-", f"slow: {max(times)} s"))
    return found


def table(results: dict) -> str:
    models = sorted({key.split("|")[0] for key in results})
    head = (f"{'export':42} {'in':>5} {'default':>10} {'s':>5} {'onnxsim':>7} {'slim':>5} {'ortB':>5} {'ortE':>5} "
            f"{'arm':>10} {'arm s':>5} {'opencl':>10} {'npu':>10} {'portable':>10} {'hostL1':>6} {'hostL2':>6} "
            f"{'oclL1':>5} {'oclL2':>5} {'npuL1':>5} {'npuL2':>5}")
    lines = [head]
    for model in models:
        get = lambda c: results.get(f"{model}|{c}")  # noqa: E731
        peers = get("peers") or {}
        default = get("default") or {}
        p = lambda k: str(peers.get(k, "-"))[:7]  # noqa: E731
        host = lambda r: str(r["host"]) if r and "host" in r else "-"  # noqa: E731
        lines.append(f"{model:42} {default.get('nodes_before', '-'):>5} {_cell(default):>10} "
                     f"{default.get('seconds', '-'):>5} {p('onnxsim'):>7} {p('onnxslim'):>5} {p('ort_basic'):>5} "
                     f"{p('ort_extended'):>5} {_cell(get('arm')):>10} {(get('arm') or {}).get('seconds', '-'):>5} "
                     f"{_cell(get('opencl')):>10} "
                     f"{_cell(get('npu')):>10} {_cell(get('portable')):>10} {host(get('arm_L1')):>6} "
                     f"{host(get('arm')):>6} {host(get('opencl_L1')):>5} {host(get('opencl')):>5} "
                     f"{host(get('npu_L1')):>5} {host(get('npu')):>5}")
    return "\n".join(lines)


def report(out: Path) -> int:
    results = _load(out / "sweep.json")
    print(table(results))
    found = failures(results)
    print(f"\nFAILURES ({len(found)})")
    for model, config, what in found:
        print(f"  {model:45} {config:9} {what}")
    return 1 if found else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("export", "sweep", "table"))
    parser.add_argument("--only", action="append", choices=list(MODELS), help="this model (repeatable)")
    parser.add_argument("--third", action="store_true", help="only the third batch (THIRD)")
    parser.add_argument("--fourth", action="store_true", help="only the fourth batch (FOURTH)")
    parser.add_argument("--fifth", action="store_true", help="only the fifth batch (FIFTH)")
    parser.add_argument("--sixth", action="store_true", help="only the sixth batch (SIXTH)")
    parser.add_argument("--seventh", action="store_true", help="only the seventh batch (SEVENTH)")
    parser.add_argument("--exporter", action="append", choices=EXPORTERS + EXTRA_EXPORTERS,
                        help="only this exporter")
    parser.add_argument("--config", action="append", choices=list(CONFIGS), help="sweep: only this configuration")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--force", action="store_true", help="export (or run) again even if done")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mirserve run")
    parser.add_argument("--mirserve-python", type=Path, default=REPO / ".venv" / "bin" / "python")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    parser.add_argument("--mirserve-tree", type=Path, default=REPO,
                        help="the mirserve source tree to run (default this checkout; e.g. a `git archive` of a "
                             "commit, so edits in progress do not change a long sweep's results)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{name}: {spec.library} {spec.builder} {spec.shape}" for name, spec in MODELS.items()))
        return 0
    batch = (THIRD if args.third else FOURTH if args.fourth else FIFTH if args.fifth
             else SIXTH if args.sixth else SEVENTH if args.seventh else MODELS)
    names, exporters = args.only or list(batch), args.exporter or list(EXPORTERS)
    if args.step == "export":
        return export_all(names, exporters, args.out, args.force)
    if args.step == "sweep":
        models = [path for name in names for exporter in exporters
                  if (path := args.out / f"{name}.{exporter}.onnx").exists()]
        sweep(models, args.config or list(CONFIGS), args.out, args.force, not args.no_peers, args.timeout,
              args.mirserve_python, args.peers_python, args.mirserve_tree.resolve())
    return report(args.out)


if __name__ == "__main__":
    sys.exit(main())
