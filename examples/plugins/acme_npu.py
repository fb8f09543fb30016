"""Example mirserve plugin: a made-up ACME edge NPU, a hard-swish fusion, and a lean pipeline.

Load it with ``MIRSERVE_PLUGIN_PATH=examples/plugins`` (or ``--plugin examples/plugins/acme_npu.py``). It adds:

- the filter ``hardswish_clip_fuse``: models converted from PaddlePaddle (PP-OCR) write hard-swish as
  ``x * Clip(x + 3, 0, 6) / 6``, four nodes plus four Constant nodes; the filter makes it one HardSwish node
  (opset >= 14) or ``x * HardSigmoid(x, alpha=1/6, beta=0.5)`` below opset 14, where HardSwish does not exist.
  It runs in the PRE band (priority 110), before the built-in rewrites, so they see the fused form;
- the target ``acme`` (places ``acme/fp16/nchw`` ...), which has its own memory;
- the pipeline ``acme_lean``: the plugin's filters, kernel pick, casts and the memory plan, without the
  built-in graph rewrites; at ``--opt-level 0`` type inference only. Chosen per run with ``--pipeline``.
"""
from __future__ import annotations

from onnx import TensorProto

from worker.passes.pipelines import MEMORY, PLACE
from worker.plugins import PRIORITY_PRE, pipeline_builder, register_filter, register_target

FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE}
HARDSWISH_SINCE = 14
CLIP_BOUNDS_AS_INPUTS_SINCE = 11

ACME = register_target("acme", description="ACME edge NPU: a made-up target of the example plugin")


def _scalar(value) -> float | None:
    """The value of a one-element constant, or None."""
    data = None if value is None else value.constant_value()
    return float(data.reshape(-1)[0]) if data is not None and data.size == 1 else None


def _clip_bounds(clip, opset: int) -> tuple[float | None, float | None]:
    if opset < CLIP_BOUNDS_AS_INPUTS_SINCE:
        return clip.attr("min"), clip.attr("max")
    return _scalar(clip.input(1)), _scalar(clip.input(2))


def _producer(value, op_type: str):
    """The node producing ``value`` if it is an ``op_type`` whose output only this pattern reads."""
    if value is None or value.producer is None or not value.producer.is_op(op_type):
        return None
    return value.producer if value.has_single_consumer() else None


def _match(div, opset: int):
    """(x, [add, clip, mul]) when ``div`` ends x * Clip(x + 3, 0, 6) / 6, else None."""
    mul = _producer(div.input(0), "Mul")
    if mul is None or _scalar(div.input(1)) != 6.0:
        return None
    for slot in (0, 1):
        clip, x = _producer(mul.input(slot), "Clip"), mul.input(1 - slot)
        add = clip and _producer(clip.input(0), "Add")
        if add is None or _clip_bounds(clip, opset) != (0.0, 6.0):
            continue
        for add_slot in (0, 1):
            if add.input(add_slot) is x and _scalar(add.input(1 - add_slot)) == 3.0:
                return x, [add, clip, mul]
    return None


def _drop_unused_constants(values) -> None:
    """Constants only the fused nodes read (3, 0, 6, 6) are dead now: remove them with the pattern."""
    for value in dict.fromkeys(v for v in values if v is not None):
        if value.is_used:
            continue
        if value.producer is not None and value.producer.is_op("Constant"):
            value.producer.graph.remove_node(value.producer)
        elif value.is_constant:
            value.graph.remove_initializer(value)


@register_filter("Div", priority=PRIORITY_PRE + 10,
                 description="x * Clip(x + 3, 0, 6) / 6 -> HardSwish(x), or x * HardSigmoid(x) before opset 14")
def hardswish_clip_fuse(ctx, div):
    found = _match(div, ctx.opset())
    if found is None:
        return False
    x, pattern = found
    if x.dtype not in FLOATS:
        return False
    graph, output = div.graph, div.output()
    if ctx.opset() >= HARDSWISH_SINCE:
        created = [graph.add_node("HardSwish", [x], [output], name=f"{div.name}_hardswish", before=div)]
    else:
        gate = graph.add_node("HardSigmoid", [x], name=f"{div.name}_hardsigmoid", before=div,
                              attributes={"alpha": 1.0 / 6.0, "beta": 0.5})
        gate.output().copy_type_from(x)
        created = [gate, graph.add_node("Mul", [x, gate.output()], [output], name=f"{div.name}_hardswish",
                                        before=div)]
    add, clip, mul = pattern
    constants = [*add.inputs, *clip.inputs[1:], div.input(1)]
    replaced = [node.name for node in (*pattern, div)]
    graph.remove_nodes([*pattern, div])
    _drop_unused_constants(c for c in constants if c is not x)
    return {"from": replaced, "to": [node.name for node in created]}


@pipeline_builder(name="acme_lean", description="the plugin filters, kernel pick, casts and memory plan, "
                                                "without built-in graph rewrites (opt level 0: type inference)")
def acme_lean(options):
    if options.opt_level == 0:
        return ["type_inference"]
    return ["type_inference", "filter_pre", "filter_simplify", "filter_domain", *PLACE, "filter_post", *MEMORY]
