"""Elimination passes (issue 3): ops that compute nothing (identity, inference Dropout, no-op Cast, Reshape,
Transpose, Pad, Slice, Expand, Concat, Split, a Gather that takes every element in order, a ScatterND that
overwrites everything, 1x1 pooling, scale by one, a Softmax or a reduction over one element) and pairs that
collapse (Transposes, Reshapes, Squeeze/Unsqueeze, Slices over other axes, a reduction and the Unsqueeze that
restores its axes, global pooling + Flatten, Reshape before a binary op, a Transpose or a Gemm written over
merged leading axes), Q/DQ pairs around data movement and a Relu or Clip that a QuantizeLinear's saturation
repeats. Registered on import."""
from worker.engine.passes.eliminate import (  # noqa: F401  (registration)
    eliminate_flatten_after_global_pooling,
    eliminate_flatten_after_innerproduct,
    eliminate_full_gather,
    eliminate_full_scatter,
    eliminate_identity,
    eliminate_nop_cast,
    eliminate_nop_concat,
    eliminate_nop_expand,
    eliminate_nop_pad,
    eliminate_nop_reshape,
    eliminate_nop_slice,
    eliminate_nop_split,
    eliminate_nop_transpose,
    eliminate_nop_where,
    eliminate_pooling1x1,
    eliminate_qdq_around_data_movement,
    eliminate_relu_before_quantize,
    eliminate_reshape_before_binaryop,
    eliminate_unit_reduce,
    eliminate_unit_softmax,
    fuse_consecutive_concats,
    fuse_consecutive_reduce_unsqueeze,
    fuse_consecutive_reshapes,
    fuse_consecutive_slices,
    fuse_consecutive_squeezes,
    fuse_consecutive_transposes,
    fuse_merged_heads_attention,
    fuse_reshape_gemm_reshape,
    fuse_reshape_transpose_reshape,
    identity_dropout_eliminate,
    identity_scale_eliminate,
)
