"""hard_swish_fuse: hard-swish written out becomes HardSwish (opset 14+), or x * HardSigmoid(x) before that.

    Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))           ->  HardSwish(x)                    (opset 14+)
    x * Clip(x + 3, 0, 6) / 6                              ->  HardSwish(x)                    (opset 14+)
                                                           ->  Mul(x, HardSigmoid(x, 1/6, 0.5))  (before 14)

The second form is how paddle2onnx writes Paddle's hard_swish (Add, Clip, Mul, Div: PP-OCR models are full
of it), in four orders: (x * c) / 6, (x * c) * (1/6), x * (c / 6), x * (c * (1/6)). HardSigmoid has existed
since opset 6, so older models still lose two of the four nodes. Clip's bounds are attributes before opset 11
and inputs from 11. The forms and the tolerance of their constants are ``support/activations.py``'s.
"""
from __future__ import annotations

from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.activations import FormRule, Params, forms
from worker.engine.passes.support.weights import FLOAT_TYPES
from worker.engine.pattern import Match, apply_rules, describe

ALPHA, BETA = 1.0 / 6.0, 0.5


class HardSwishForm(FormRule):
    def check(self, ctx: PassContext, match: Match) -> Params | str:
        params = self.form.read(match, ctx.opset())
        if isinstance(params, str):
            return params
        if "clip" not in match:  # x * HardSigmoid(x): nothing shorter before opset 14
            if ctx.opset() < 14:
                return (f"HardSwish needs opset 14, and the model imports opset {ctx.opset()} "
                        f"(x * HardSigmoid(x) is the shortest spelling there)")
        elif match.value("x").dtype not in FLOAT_TYPES:
            return f"the input of the hard-swish at {describe(match.node('clip'))} is not a float tensor"
        return params

    def rewrite(self, ctx: PassContext, match: Match, params: Params) -> Node | list[Node]:
        x, out, graph = match.value("x"), match.value("out"), match.graph
        first = match.node("clip") if "clip" in match else match.node("gate")
        if ctx.opset() >= 14:
            return graph.add_node("HardSwish", [x], outputs=[out], name=first.name, before=match.node("product"))
        gate = graph.add_node("HardSigmoid", [x], outputs=[graph.make_value(f"{first.name}_gate", x.dtype, x.shape)],
                              name=first.name, attributes={"alpha": ALPHA, "beta": BETA}, before=first)
        return [gate, graph.add_node("Mul", [x, gate.output()], outputs=[out], name=match.node("product").name,
                                     before=first)]


@register_pass(name="hard_swish_fuse", kind=PassKind.PROGRAM, level=1,
               description="turn x * HardSigmoid(x) and x * Clip(x + 3, 0, 6) / 6 into HardSwish (opset 14+), "
                           "or the latter into x * HardSigmoid(x)")
def hard_swish_fuse(ctx: PassContext) -> PassResult:
    return apply_rules(ctx, [HardSwishForm(form) for form in forms("hard_swish")])
