"""Cleanup and folding passes (issue 3): constants to initializers, dead code, duplicate initializers,
common subexpressions, constant and shape folding, If with a constant condition. Registered on import."""
from worker.engine.passes.fold import (  # noqa: F401  (registration)
    constant_folding,
    constant_to_initializer,
    eliminate_common_subexpression,
    eliminate_deadend,
    eliminate_duplicate_dim_read,
    eliminate_duplicate_initializer,
    eliminate_if_with_const_cond,
    eliminate_shape_op,
    eliminate_unused_initializer,
    quantize_weight_fold,
    remove_initializer_from_input,
)
