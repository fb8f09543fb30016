"""type_inference: a dtype and a shape for every value, nested bodies included (``worker/engine/inference.py``).

onnx's shape inference with data propagation, then the shape subgraphs it cannot see through evaluated, until
nothing new is learned; the trace gets the coverage figures.
"""
from __future__ import annotations

from worker.engine.inference import infer_types
from worker.engine.passes.base import Analysis, PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass


@register_pass(name="type_inference", kind=PassKind.STMT, level=0, requires=(Analysis.ORDER,),
               description="infer the dtype and shape of every value from the input shapes, "
                           "evaluating shape subgraphs")
def type_inference(ctx: PassContext) -> PassResult:
    result = PassResult()
    result.data.update(infer_types(ctx.model, ctx.options.limits))
    return result
