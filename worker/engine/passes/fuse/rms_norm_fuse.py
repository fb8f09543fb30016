"""rms_norm_fuse: RMSNorm written out as reductions becomes the RMSNormalization op (opset 23+).

    r = Sqrt(ReduceMean(x ^ 2, axes) + eps)       (axes: the trailing dims, keepdims=1; x ^ 2 as Pow(x, 2)
                                                   or Mul(x, x))
    y = x * Reciprocal(r)  |  x * (1 / r)  |  x / r
        [* gamma]                              ->  RMSNormalization(x, gamma, axis, epsilon=eps)

Llama, Mistral, Qwen2 and T5 write their RMSNorm so: the dynamo exporter spells rsqrt as Reciprocal(Sqrt),
TorchScript as Div(1, Sqrt); the casts to float32 and back around it are no-ops on float32 models and are
gone by the time this pass runs (eliminate_nop_cast). Refused before opset 23 (``--target-opset 23`` raises
it), where no valid place has a RMSNormalization kernel, when the reduction does not average a trailing
block of dims of a float tensor whose normalized dims are known, when eps, the exponent or the one are not
the constants they must be, and when gamma varies along a dim that is not normalized. gamma becomes a
constant of exactly the normalized shape (ones when there is none). Numeric effect: the op computes in
float32 (its stash_type) in one kernel; the result differs from the chain's in the last bits.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.transformer_chains import INVERSES, RMSNormChain
from worker.engine.pattern import apply_rules


@register_pass(name="rms_norm_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn RMSNorm written out as Pow/ReduceMean/Add/Sqrt/Div or Reciprocal/Mul into "
                           "RMSNormalization (opset 23+)")
def rms_norm_fuse(ctx: PassContext) -> PassResult:
    # With a scale first, so the chain's last Mul goes into the op rather than staying behind it.
    return apply_rules(ctx, [RMSNormChain(square, inverse, has_scale) for has_scale in (True, False)
                             for inverse in INVERSES for square in ("pow", "mul")])
