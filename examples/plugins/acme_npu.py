"""Example mirserve plugin: a made-up ACME edge NPU, an attention-head fusion, and a lean pipeline.

Load it with ``MIRSERVE_PLUGIN_PATH=examples/plugins`` (or ``--plugin examples/plugins/acme_npu.py``). It adds:

- the op ``mirserve.SplitHeads(X)``: X reshaped to four axes (attribute ``shape``: batch, sequence, heads,
  head size, as Reshape reads it) with the sequence and head axes swapped, the per-head layout attention reads
  its queries and values in; the NPU's DMA engine does the reorder while it copies, so one kernel does both
  (its body is the Reshape and the Transpose, so any runtime runs it);
- the filter ``split_heads_fuse``, bound to Transpose in the DOMAIN band (after the built-in fusions, before
  kernel pick): ``Transpose(Reshape(x, shape), perm=[0, 2, 1, 3])`` becomes that op when only the Transpose
  reads the Reshape and the shape is a constant of four entries. Opt level 2 and not portable, like the
  built-in fusions into mirserve ops, and bound to the op's kernel: skipped when no valid place has one;
- the target ``acme`` (places ``acme/fp16/nchw`` ...), which has its own memory and its own cost figures for
  kernel pick (``ACME_COST``), and kernel table entries: for its own op on acme (fp16 and fp32, made up), on
  x86 (onnxruntime runs the body) and on host (the reference fallback, which runs the body); and on acme for
  the built-in ``mirserve.AddLayerNormalization`` and ``AddLayerNormalizationWithSum`` (a transformer block's
  residual Add and LayerNormalization, which the built-in ``add_layer_norm_fuse`` makes): a plugin gives a
  built-in op kernels on its own target, and the built-in fusion then fuses for that target too;
- the pipeline ``acme_lean``: the plugin's filters, kernel pick, casts and the memory plan, without the
  built-in graph rewrites; at ``--opt-level 0`` type inference only. Chosen per run with ``--pipeline``.
"""
from __future__ import annotations

from onnx import AttributeProto, TensorProto, helper

from worker.engine.mirserve_domain.ops import DOMAIN, ref
from worker.engine.passes.pipelines import MEMORY, PLACE
from worker.engine.plugins import (PRIORITY_DOMAIN, DomainOp, pipeline_builder, register_filter, register_kernels,
                            register_op, register_target)

FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
SPLIT_HEADS = "SplitHeads"
#: The built-in residual-norm ops the NPU runs too: name -> outputs.
ADD_NORMS = {"AddLayerNormalization": ("Y",), "AddLayerNormalizationWithSum": ("Y", "S")}

#: What kernel pick weighs on it (made up, in the units of worker/engine/kernels/data/costs.toml): fp16 fifty
#: times an ARM core's rate, and a DMA engine that copies and converts for a tenth of the CPU's cost per byte.
ACME_COST = {"mac": {"fp16": 0.001, "fp32": 0.002, "default": 0.002}, "byte": 0.005,
             "io_copy": {"fixed": 1000.0, "byte": 0.01}, "calib": {"fixed": 500.0, "byte": 0.01}}
ACME = register_target("acme", description="ACME edge NPU: a made-up target of the example plugin", cost=ACME_COST)


def _split_heads_body(opset: int) -> list:
    """Constant (the referenced shape; value_ints from opset 12, which the filter requires), Reshape, Transpose."""
    shape = helper.make_node("Constant", [], ["shape"])
    shape.attribute.append(ref("value_ints", "shape", AttributeProto.INTS))
    return [shape, helper.make_node("Reshape", ["X", "shape"], ["heads"]),
            helper.make_node("Transpose", ["heads"], ["Y"], perm=[0, 2, 1, 3])]


register_op(DomainOp(SPLIT_HEADS, ("X",), ("Y",), {"shape": None}, _split_heads_body,
                     "X reshaped to [batch, sequence, heads, head size] (attribute shape, as Reshape reads it), "
                     "then the sequence and head axes swapped"))


def _kernel(op: str, inputs, outputs, precision: str, origin: str, **extra) -> dict:
    """A kernel entry: every port in the kernel's own precision and layout."""
    same = {"precision": "same", "layout": "same"}
    return {"op": op, "domain": DOMAIN, "since": 1, "until": None, "precision": precision,
            "layout": extra.pop("layout", "nchw"), "inputs": [{"name": name, **same} for name in inputs],
            "outputs": [{"name": name, **same} for name in outputs], "origin": origin, **extra}


def _split_heads(precision: str, origin: str, **extra) -> dict:
    return _kernel(SPLIT_HEADS, ("X",), ("Y",), precision, origin, **extra)


def _add_norms(precision: str, origin: str) -> list[dict]:
    return [_kernel(op, ("A", "B", "scale", "bias"), outputs, precision, origin) for op, outputs in ADD_NORMS.items()]


def _cast(op: str, variant: str, precision: str, port_in: dict, port_out: dict, **extra) -> dict:
    """A cast kernel of acme: copies to and from host memory, conversions between fp32 and fp16."""
    return {"op": op, "domain": DOMAIN, "since": 1, "until": None, "precision": precision, "layout": "any",
            "variant": variant, "inputs": [{"name": "X", "layout": "same", **port_in}],
            "outputs": [{"name": "Y", "layout": "same", **port_out}], "origin": "made up: the ACME NPU's DMA and "
            "conversion units", **extra}


register_kernels([
    _split_heads("fp16", "made up: the ACME NPU's DMA engine, reordering while it copies"),
    _split_heads("fp32", "made up: the ACME NPU's DMA engine, reordering while it copies"),
    *_add_norms("fp16", "made up: the ACME NPU's fused residual-norm kernel"),
    *_add_norms("fp32", "made up: the ACME NPU's fused residual-norm kernel"),
    _cast("io_copy", "host_to_device", "any", {"precision": "same", "target": "host"}, {"precision": "same"}),
    _cast("io_copy", "device_to_host", "any", {"precision": "same"}, {"precision": "same", "target": "host"}),
    _cast("calib", "fp32_to_fp16", "fp16", {"precision": "fp32"}, {"precision": "fp16"},
          constraints={"attributes": {"to": [TensorProto.FLOAT16]}}),
    _cast("calib", "fp16_to_fp32", "fp16", {"precision": "fp16"}, {"precision": "fp32"},
          constraints={"attributes": {"to": [TensorProto.FLOAT]}}),
], target="acme")
register_kernels([_split_heads("fp32", "onnxruntime runs the op's function body (its CPU Reshape and Transpose)")],
                 target="x86")
register_kernels([_split_heads("any", "runs the op's function body (Reshape, Transpose) with the reference kernels",
                               layout="any", types=["bfloat16", "double", "float", "float16"])], target="host")


@register_filter("Transpose", priority=PRIORITY_DOMAIN, level=2, portable=False,
                 kernels=[f"{DOMAIN}.{SPLIT_HEADS}"],
                 description="Transpose(Reshape(x, shape), perm=[0, 2, 1, 3]) -> mirserve.SplitHeads(x, shape)")
def split_heads_fuse(ctx, transpose):
    if list(transpose.attr("perm") or []) != [0, 2, 1, 3] or ctx.opset("") < 12:
        return False
    heads = transpose.input(0)
    reshape = heads.producer
    if reshape is None or not reshape.is_op("Reshape") or not heads.has_single_consumer():
        return False
    shape = reshape.input(1).constant_value() if reshape.input(1) is not None else None
    if shape is None or shape.size != 4 or heads.dtype not in FLOATS:
        return False
    if reshape.attr("allowzero", 0) and 0 in shape:  # a zero meaning a zero, not "copy this axis"
        return False
    graph = transpose.graph
    fused = graph.add_node(SPLIT_HEADS, [reshape.input(0)], [transpose.output()], domain=DOMAIN,
                           name=f"{transpose.name}_heads", before=transpose,
                           attributes={"shape": [int(d) for d in shape.reshape(-1)]})
    replaced = [reshape.name, transpose.name]
    graph.remove_unused([transpose, reshape, reshape.input(1)])
    return {"from": replaced, "to": [fused.name]}


@pipeline_builder(name="acme_lean", description="the plugin filters, kernel pick, casts and memory plan, "
                                                "without built-in graph rewrites (opt level 0: type inference)")
def acme_lean(options):
    if options.opt_level == 0:
        return ["type_inference"]
    return ["type_inference", "filter_pre", "filter_simplify", "filter_domain", *PLACE, "filter_post", *MEMORY]
