"""quantize_weight_fold: a QuantizeLinear of a constant becomes the quantized initializer; the
DequantizeLinear that carries the scale and zero point stays.

    w:fp32 -> QuantizeLinear(s, zp) -> DequantizeLinear(s, zp) -> Conv
    becomes   w_q:int8 -> DequantizeLinear(s, zp) -> Conv

This is the QDQ form runtimes expect for weights, and what onnxruntime's basic level does offline. The model
stays quantized: every DequantizeLinear is kept, so kernel pick still finds the scale of each int8 kernel
and never sees a float weight where an int8 one was meant. Weights are stored in 8 bits instead of 32, and
no runtime quantizes them again on every run. Quantizing a constant here is exact: onnxruntime computes it,
with the rounding and saturation the runtime itself would apply. Activations keep their Q/DQ pairs
(constant_folding never folds Q/DQ).
"""
from __future__ import annotations

from worker.engine.evaluate import evaluate_on_onnxruntime
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.constants import replace_with_constant
from worker.engine.passes.registry import register_pass


#: Float weights quantized in one onnxruntime session at most (a session copies what it is fed).
CHUNK_BYTES = 64 << 20


@register_pass(name="quantize_weight_fold", peer="onnxruntime", kind=PassKind.PROGRAM, level=1,
               description="store constant weights quantized: QuantizeLinear of a constant becomes an int8 "
                           "initializer, its DequantizeLinear kept")
def quantize_weight_fold(ctx: PassContext) -> PassResult:
    result = PassResult()
    for graph in ctx.graph.live_graphs():
        batch = []
        for node in graph.nodes_of_type("QuantizeLinear"):
            inputs = [None if v is None else v.constant_value() for v in node.inputs]
            if inputs[0] is None or any(a is None for v, a in zip(node.inputs, inputs) if v is not None):
                continue  # an activation: quantized at run time, as the model says
            if node.output().is_graph_output:
                result.refused("quantize_weight_fold: its output is a graph output")
                continue
            batch.append((node, inputs))
        for chunk in _chunks(batch):
            for (node, inputs), computed in zip(chunk, evaluate_on_onnxruntime(chunk, ctx.opset())):
                if computed is None:
                    result.refused("quantize_weight_fold: onnxruntime could not quantize the constant")
                    continue
                # Quantizing keeps the input's shape (onnxruntime answers [1] for a 0-d input).
                replace_with_constant(graph, node.output(), computed[0].reshape(inputs[0].shape))
                graph.remove_node(node)
                result.rewrote({"rule": "quantize_weight_fold", "from": [node.name], "to": []})
    return result


def _chunks(batch: list) -> list[list]:
    """Runs of the batch whose float weights add up to at most ``CHUNK_BYTES`` (one when a weight is larger),
    so that one session never holds a copy of many weights."""
    chunks: list[list] = []
    size = CHUNK_BYTES
    for item in batch:
        nbytes = item[1][0].nbytes
        if size + nbytes > CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += nbytes
    return chunks
