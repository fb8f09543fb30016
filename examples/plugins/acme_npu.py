"""Example mirserve plugin: a made-up ACME edge NPU, a residual-norm fusion, and a lean pipeline.

Load it with ``MIRSERVE_PLUGIN_PATH=examples/plugins`` (or ``--plugin examples/plugins/acme_npu.py``). It adds:

- the op ``mirserve.SkipLayerNormalization(input, skip, scale, bias)``: ``input + skip`` normalized by
  LayerNormalization, the residual connection of every transformer block in one kernel (onnxruntime has it as
  a contrib op that only onnxruntime runs; here its body is the two standard ops, so any runtime runs it);
- the filter ``skip_layer_norm_fuse``, bound to LayerNormalization in the DOMAIN band (after the built-in
  fusions, before kernel pick): ``LayerNormalization(Add(a, b))`` becomes that op when only the norm reads
  the sum and the norm's Mean / InvStdDev outputs are unused. Opt level 2 and not portable, like the
  built-in fusions into mirserve ops, and bound to the op's kernel: skipped when no valid place has one;
- the target ``acme`` (places ``acme/fp16/nchw`` ...), which has its own memory and its own cost figures for
  kernel pick (``ACME_COST``), and kernel table entries for
  the op: on acme (fp16 and fp32, made up), on x86 (onnxruntime's CPU kernel of its contrib op of the same
  meaning, last axis only) and on host (the reference fallback, which runs the function body);
- the pipeline ``acme_lean``: the plugin's filters, kernel pick, casts and the memory plan, without the
  built-in graph rewrites; at ``--opt-level 0`` type inference only. Chosen per run with ``--pipeline``.
"""
from __future__ import annotations

import numpy as np
from onnx import AttributeProto, TensorProto, helper

from worker.engine.mirserve_domain.ops import DOMAIN, ref
from worker.engine.passes.pipelines import MEMORY, PLACE
from worker.engine.plugins import (PRIORITY_DOMAIN, DomainOp, pipeline_builder, register_filter, register_kernels,
                            register_op, register_target)

FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
SKIP_LAYER_NORMALIZATION = "SkipLayerNormalization"

#: What kernel pick weighs on it (made up, in the units of worker/engine/kernels/data/costs.toml): fp16 fifty
#: times an ARM core's rate, and a DMA engine that copies and converts for a tenth of the CPU's cost per byte.
ACME_COST = {"mac": {"fp16": 0.001, "fp32": 0.002, "default": 0.002}, "byte": 0.005,
             "io_copy": {"fixed": 1000.0, "byte": 0.01}, "calib": {"fixed": 500.0, "byte": 0.01}}
ACME = register_target("acme", description="ACME edge NPU: a made-up target of the example plugin", cost=ACME_COST)


def _skip_layer_norm_body(opset: int) -> list:
    """Add, then LayerNormalization (a standard op from opset 17, which the filter requires)."""
    norm = helper.make_node("LayerNormalization", ["sum", "scale", "bias"], ["output"])
    norm.attribute.extend([ref("axis", "axis", AttributeProto.INT),
                           ref("epsilon", "epsilon", AttributeProto.FLOAT),
                           ref("stash_type", "stash_type", AttributeProto.INT)])
    return [helper.make_node("Add", ["input", "skip"], ["sum"]), norm]


register_op(DomainOp(SKIP_LAYER_NORMALIZATION, ("input", "skip", "scale", "bias"), ("output",),
                     {"axis": None, "epsilon": None, "stash_type": None}, _skip_layer_norm_body,
                     "input + skip, normalized by LayerNormalization (a transformer block's residual and norm)"))


def _kernel(precision: str, origin: str, **extra) -> dict:
    """A kernel entry for the op: every port in the kernel's own precision and layout."""
    same = {"precision": "same", "layout": "same"}
    return {"op": SKIP_LAYER_NORMALIZATION, "domain": DOMAIN, "since": 1, "until": None, "precision": precision,
            "layout": extra.pop("layout", "nchw"),
            "inputs": [{"name": name, **same} for name in ("input", "skip", "scale", "bias")],
            "outputs": [{"name": "output", **same}], "origin": origin, **extra}


def _cast(op: str, variant: str, precision: str, port_in: dict, port_out: dict, **extra) -> dict:
    """A cast kernel of acme: copies to and from host memory, conversions between fp32 and fp16."""
    return {"op": op, "domain": DOMAIN, "since": 1, "until": None, "precision": precision, "layout": "any",
            "variant": variant, "inputs": [{"name": "X", "layout": "same", **port_in}],
            "outputs": [{"name": "Y", "layout": "same", **port_out}], "origin": "made up: the ACME NPU's DMA and "
            "conversion units", **extra}


register_kernels([
    _kernel("fp16", "made up: the ACME NPU's fused residual-norm kernel"),
    _kernel("fp32", "made up: the ACME NPU's fused residual-norm kernel"),
    _cast("io_copy", "host_to_device", "any", {"precision": "same", "target": "host"}, {"precision": "same"}),
    _cast("io_copy", "device_to_host", "any", {"precision": "same"}, {"precision": "same", "target": "host"}),
    _cast("calib", "fp32_to_fp16", "fp16", {"precision": "fp32"}, {"precision": "fp16"},
          constraints={"attributes": {"to": [TensorProto.FLOAT16]}}),
    _cast("calib", "fp16_to_fp32", "fp16", {"precision": "fp16"}, {"precision": "fp32"},
          constraints={"attributes": {"to": [TensorProto.FLOAT]}}),
], target="acme")
register_kernels([_kernel("fp32", "onnxruntime com.microsoft.SkipLayerNormalization CPU kernel (last axis only)",
                          constraints={"attributes": {"axis": [-1]}})], target="x86")
register_kernels([_kernel("any", "runs the op's function body (Add, LayerNormalization) with the reference kernels",
                          layout="any", types=["bfloat16", "double", "float", "float16"])], target="host")


def _bias(graph, norm):
    """The norm's bias, or zeros shaped like its scale (every input of a mirserve op is always passed)."""
    if norm.input(2) is not None:
        return norm.input(2)
    scale = norm.input(1)
    if not scale.is_static:
        return None
    dtype = helper.tensor_dtype_to_np_dtype(scale.dtype)
    return graph.add_initializer(f"{norm.name}_zero_bias", np.zeros(scale.shape, dtype))


@register_filter("LayerNormalization", priority=PRIORITY_DOMAIN, level=2, portable=False,
                 kernels=[f"{DOMAIN}.{SKIP_LAYER_NORMALIZATION}"], description="LayerNormalization(Add(a, b)) -> mirserve.SkipLayerNormalization(a, b, scale, bias)")
def skip_layer_norm_fuse(ctx, norm):
    total = norm.input(0)
    add = total.producer
    if add is None or not add.is_op("Add") or not total.has_single_consumer() or None in add.inputs:
        return False
    if total.dtype not in FLOATS or any(v.is_used for v in norm.outputs[1:]):
        return False
    graph = norm.graph
    bias = _bias(graph, norm)
    if bias is None:
        return False
    fused = graph.add_node(SKIP_LAYER_NORMALIZATION, [*add.inputs, norm.input(1), bias], [norm.output()],
                           domain=DOMAIN, name=f"{norm.name}_skip", before=norm,
                           attributes={"axis": int(norm.attr("axis", -1)),
                                       "epsilon": float(norm.attr("epsilon", 1e-5)),
                                       "stash_type": int(norm.attr("stash_type", 1))})
    replaced = [add.name, norm.name]
    graph.remove_nodes([add, norm])
    return {"from": replaced, "to": [fused.name]}


@pipeline_builder(name="acme_lean", description="the plugin filters, kernel pick, casts and memory plan, "
                                                "without built-in graph rewrites (opt level 0: type inference)")
def acme_lean(options):
    if options.opt_level == 0:
        return ["type_inference"]
    return ["type_inference", "filter_pre", "filter_simplify", "filter_domain", *PLACE, "filter_post", *MEMORY]
