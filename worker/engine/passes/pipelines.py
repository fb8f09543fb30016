"""Named pipelines: plain ordered lists of pass names, with groups that repeat to a fixed point.

A pipeline may also be built from the run's options (like the Sophon seed's ``manage_passes``), which is how a
plugin offers a pipeline that picks its passes per job.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, Union

from worker.engine.origin import BUILT_IN, current_origin

if TYPE_CHECKING:
    from worker.engine.options import OptimizeOptions


@dataclass(frozen=True)
class FixedPoint:
    """Run ``steps`` again and again until an iteration rewrites nothing, at most ``max_iterations`` times."""

    name: str
    steps: tuple[str, ...]
    max_iterations: int = 8


Step = Union[str, FixedPoint]


@dataclass(frozen=True)
class Pipeline:
    name: str
    description: str
    steps: tuple[Step, ...] = ()
    #: Builds the steps from the options instead of ``steps`` (options-driven pipelines).
    build: Callable[["OptimizeOptions"], Sequence[Step]] | None = None
    origin: str = "built-in"

    def steps_for(self, options: "OptimizeOptions") -> tuple[Step, ...]:
        return tuple(self.build(options)) if self.build is not None else self.steps

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "origin": self.origin,
                "passes": None if self.build is not None else pass_names(self.steps)}


def pass_names(steps: Sequence[Step]) -> list[str]:
    """Every pass name of ``steps`` in order, each once."""
    return list(dict.fromkeys(_flatten(steps)))


def _flatten(steps: Sequence[Step]) -> Iterator[str]:
    for step in steps:
        if isinstance(step, FixedPoint):
            yield from step.steps
        else:
            yield step


# The default pipeline, in Paddle-Lite's order. Each family owns one slot, listed here in run order:
#: Checks before any rewriting (every op has a kernel in some valid place).
SUPPORT: tuple[str, ...] = ("support_check",)
#: Cleanup, constant and shape folding, eliminations (level 1). Initializer inputs first (they hide the light
#: models' weights from folding); folding before the eliminations that need constants; merging and dead-code
#: removal last, to clean up after everything before them.
CLEANUP: tuple[str, ...] = (
    "remove_initializer_from_input", "constant_to_initializer", "eliminate_if_with_const_cond",
    "eliminate_shape_op", "eliminate_duplicate_dim_read", "constant_folding", "quantize_weight_fold",
    "eliminate_identity", "identity_dropout_eliminate", "eliminate_nop_cast", "eliminate_nop_reshape",
    "eliminate_nop_transpose", "eliminate_nop_pad", "eliminate_nop_slice", "eliminate_nop_expand",
    "eliminate_nop_where", "eliminate_nop_concat", "eliminate_nop_split", "eliminate_full_gather",
    "eliminate_full_scatter", "eliminate_pooling1x1", "eliminate_unit_softmax", "eliminate_unit_reduce",
    "identity_scale_eliminate",
    "eliminate_flatten_after_innerproduct", "eliminate_flatten_after_global_pooling",
    "eliminate_reshape_before_binaryop", "fuse_reshape_transpose_reshape", "fuse_reshape_gemm_reshape",
    "fuse_merged_heads_attention",
    "fuse_consecutive_transposes", "fuse_consecutive_reshapes", "fuse_consecutive_squeezes", "fuse_consecutive_slices", "fuse_consecutive_concats",
    "fuse_consecutive_reduce_unsqueeze", "eliminate_qdq_around_data_movement", "eliminate_relu_before_quantize",
    "eliminate_common_subexpression", "eliminate_duplicate_initializer", "eliminate_deadend",
    "eliminate_unused_initializer",
)
#: Chains recognised by their structure and constants (normalizations and activations written out op by op),
#: first in each round: before any fold moves their constants into weights, and before a cleanup such as
#: eliminate_reshape_before_binaryop reroutes one reader of a chain's input and so splits the chain (GPT-2's
#: tanh Gelu reads one Reshape from three ops).
CHAINS: tuple[str, ...] = ("layer_norm_fuse", "rms_norm_fuse", "gelu_fuse", "hard_swish_fuse", "transformer_domain_fuse")
#: Fusions into standard ONNX ops (level 1) and replacements (level 2).
#: Order: BatchNormalization absorbs its trailing affine before it folds into a conv.
FUSE: tuple[str, ...] = (
    "pad_conv_fuse", "pad_pool_fuse", "bn_scale_fuse", "conv_scale_fuse", "conv_elementwise_fuse", "conv_bn_fuse",
    "fc_fuse", "gemm_bn_fuse", "fold_scale_axis", "split_fuse",
    "rotary_embedding_fuse", "attention_fuse",
)
REPLACE: tuple[str, ...] = (
    "simplify_inference", "reduction_global_pool_replace", "adaptive_pool_global_replace",
    "prelu_leaky_relu_replace", "conv_gemm_replace", "transpose_softmax_transpose_fuse",
)
#: All of the above, repeated together until nothing changes: a fusion often exposes an elimination and the
#: other way round.
SIMPLIFY: tuple[str, ...] = CHAINS + CLEANUP + FUSE + REPLACE
#: Fusions into ops of the project's own domain (level 2, not under --portable), after standard fusions.
DOMAIN_FUSE: tuple[str, ...] = ("qlinear_fuse", "shuffle_channel_fuse", "conv_activation_fuse",
                                 "gemm_activation_fuse", "elementwise_activation_fuse", "add_layer_norm_fuse")
#: Kernel pick per place, place inference, io_copy / calib / layout casts and their cleanup.
PLACE: tuple[str, ...] = ("static_kernel_pick", "variable_place_inference", "type_target_cast",
                          "type_precision_cast", "type_layout_cast", "type_cast_cleanup", "fp16_storage",
                          "place_report")
#: Memory planning over the final execution order.
MEMORY: tuple[str, ...] = ("memory_plan",)

DEFAULT = Pipeline(
    name="default",
    description="type inference, graph rewrites, kernel pick per place, casts, memory plan",
    steps=(
        "type_inference",
        "filter_pre",  # plugin filters of priority 0-199 (worker/engine/plugins/filters.py has the bands)
        *SUPPORT,
        FixedPoint("simplify", SIMPLIFY + ("filter_simplify",), max_iterations=8),
        *DOMAIN_FUSE,
        "filter_domain",
        *PLACE,
        "filter_post",
        *MEMORY,
    ),
)

ANALYSIS = Pipeline(
    name="analysis",
    description="type inference only: the model is written back unchanged",
    steps=("type_inference",),
)

_PIPELINES: dict[str, Pipeline] = {p.name: p for p in (DEFAULT, ANALYSIS)}


def register_pipeline(pipeline: Pipeline) -> Pipeline:
    """Add a pipeline; one added while a plugin loads is that plugin's (``worker.engine.origin``)."""
    if pipeline.origin == BUILT_IN and current_origin() != BUILT_IN:
        pipeline = dataclasses.replace(pipeline, origin=current_origin())
    existing = _PIPELINES.get(pipeline.name)
    if existing is not None:
        raise ValueError(f"pipeline {pipeline.name!r} from {pipeline.origin} clashes with the pipeline of the "
                         f"same name from {existing.origin}")
    _PIPELINES[pipeline.name] = pipeline
    return pipeline


def unregister_pipeline(name: str, *, force: bool = False) -> None:
    """Remove a plugin's pipeline; built-in ones stay unless ``force`` (see ``places.unregister_target``)."""
    pipeline = _PIPELINES.get(name)
    if pipeline is not None and (force or pipeline.origin != BUILT_IN):
        del _PIPELINES[name]


def get_pipeline(name: str) -> Pipeline | None:
    return _PIPELINES.get(name)


def all_pipelines() -> list[Pipeline]:
    return list(_PIPELINES.values())
