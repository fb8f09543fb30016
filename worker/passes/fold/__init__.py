"""Cleanup and folding passes (issue 3): constants to initializers, dead code, duplicate initializers,
common subexpressions, constant and shape folding, If with a constant condition. Registered on import."""
from worker.passes.fold import (  # noqa: F401  (registration)
    common_subexpression,
    constant_folding,
    constant_to_initializer,
    dead_code,
    duplicate_initializer,
    if_inline,
    initializer_input,
    quantize_weight_fold,
    shape_folding,
    unused_initializer,
)
