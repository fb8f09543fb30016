"""gelu_fuse: Gelu written out with Erf (or its tanh approximation) becomes the Gelu op (opset 20+).

    0.5 * x * (1 + Erf(x / sqrt(2)))                                   ->  Gelu(x)
    0.5 * x * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x ^ 3)))       ->  Gelu(x, approximate="tanh")

The product may be spelled in any of the orders exporters use and x / sqrt(2) as x * (1 / sqrt(2))
(``support/activations.py`` lists the forms; their constants must match to its one tolerance). Refused
before opset 20, where Gelu does not exist (``--target-opset 20`` raises it; onnxruntime's own Gelu is a contrib
op, out of scope for standard-op output), and where no valid place has a Gelu kernel. Numeric effect: the
runtime's Gelu instead of the chain (last-bit rounding).
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.activations import forms
from worker.engine.passes.support.transformer_chains import GeluChain
from worker.engine.pattern import apply_rules


@register_pass(name="gelu_fuse", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="turn Gelu written out with Erf or Tanh into the Gelu op (opset 20+)")
def gelu_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [GeluChain(form) for form in forms("gelu_erf", "gelu_tanh")])
