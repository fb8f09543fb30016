"""place_report: the report's ``kernels`` section and the model metadata that records how it was placed.

    report["kernels"] = {"nodes": [{node, op, kernel, place[, fallback]}...], "places": {place: node count},
                         "casts": [{node, cast, from, to, value, bytes}...], "counts": {...}}

A node on a host place the user did not list carries ``fallback``: {kind, reason, user_place}: why no place
the user listed runs it (kind ``no kernel``, ``precision``, ``layout``, ``constraints``; ``plan`` when one
applies but the placement plan chose the host for the casts it saves, ``pick`` when one applies otherwise) and whether a kernel of a user place applies to it as it stands (``user_place``). A cast's
``bytes`` are what it writes (None when its shape is not static).
    model metadata: mirserve.valid_places = "arm/fp16/nhwc,arm/fp32/nchw,host/fp16/nhwc,host/fp32/nchw"
                    mirserve.pipeline     = "default: type_inference,support_check,...,place_report,..."
"""
from __future__ import annotations

import dataclasses

from onnx import helper

from worker.engine.kernels.pick import FLOATS, first_place, rank
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.casts import cast_kind, same_memory
from worker.engine.passes.support.placement import KERNEL_KEY, PLACE_KEY, node_facts, node_opset
from worker.engine.places import HOST, ValidPlaces


def _written_bytes(value) -> int | None:
    numel = value.numel() if value is not None else None
    if numel is None or not value.dtype:
        return None
    return numel * helper.tensor_dtype_to_np_dtype(value.dtype).itemsize


def host_fallback(ctx: PassContext, node) -> dict | None:
    """Why ``node``, placed on host, runs on no place the user listed; None when the user listed a host place
    (or no kernel tables are loaded)."""
    listed = list(ctx.places.places[:ctx.places.user_count])
    if node.graph is not ctx.graph:  # a body node on host: its parent lent it only targets sharing host memory
        listed = [p for p in listed if same_memory(p.target.name, HOST.name)]
    user = ValidPlaces(listed, len(listed))
    targets = sorted(user.targets)
    if ctx.kernels is None or HOST.name in targets or not targets:
        return None
    kernel = node.pick.kernel if node.pick is not None else None
    op, op_domain = (kernel.op, kernel.domain) if kernel is not None else (node.op_type, node.domain)
    qualified = f"{op_domain}.{op}" if op_domain else op
    opset = node_opset(ctx.opset, node) if op_domain == node.domain else ctx.opset(op_domain)
    where = " or ".join(targets)
    candidates = ctx.kernels.kernels(op, op_domain, targets=targets)
    if not candidates:
        return {"kind": "no kernel", "reason": f"no kernel for {qualified} on {where}", "user_place": False}
    at_opset = [k for k in candidates if k.covers(opset)]
    if not at_opset:
        return {"kind": "constraints", "user_place": False,
                "reason": f"{where} has {qualified} kernels, none for opset {opset}"}
    facts = dataclasses.replace(node_facts(node, node_opset(ctx.opset, node)), op=op, domain=op_domain,
                                opset=opset)
    scored, refused = rank(at_opset, facts, user)
    if scored:
        best = scored[0].resolved
        where = f"{best.kernel.id} applies ({best.kernel.target}/{best.precision.value}/{best.layout.value})"
        by_choice = (ctx.report.get("placement") or {}).get("host_by_choice") or {}
        if by_choice.get(f"{node.domain}.{node.op_type}" if node.domain else node.op_type):
            return {"kind": "plan", "user_place": True,
                    "reason": f"{where}, but the placement plan chose the host: the casts around it there cost more"}
        return {"kind": "pick", "user_place": True, "reason": f"{where}, but the kernel pick chose a host kernel"}
    kinds = [_refusal_kind(kernel, reason, user) for kernel, reason in refused]
    for kind in ("layout", "precision", "constraints"):  # the nearest miss first
        if kind in kinds:
            reason = refused[kinds.index(kind)][1]
            return {"kind": kind, "reason": reason, "user_place": False}
    return {"kind": "constraints", "reason": refused[0][1], "user_place": False}


def _refusal_kind(kernel, reason: str, user: ValidPlaces) -> str:
    """``layout`` when the kernel's target and precision fit a user place but its layout does not;
    ``precision`` when its precision (or the data's element type) does not fit; else ``constraints``."""
    if first_place(kernel, user) is None:
        fits_precision = any(kernel.target == p.target.name and (
            kernel.precision is p.precision or kernel.precision not in FLOATS) for p in user)
        return "layout" if fits_precision else "precision"
    if " does not take " in reason:
        return "precision"
    return "constraints"


def kernels_section(graph, ctx: PassContext | None = None) -> dict:
    nodes, casts, per_place = [], [], {}
    for node in graph.all_nodes():
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        place = node.metadata.get(PLACE_KEY)
        entry = {"node": node.name, "op": op, "kernel": node.metadata.get(KERNEL_KEY), "place": place}
        nodes.append(entry)
        if place is not None:
            per_place[place] = per_place.get(place, 0) + 1
        kind = cast_kind(node)
        if kind is not None:
            source = node.input(0)
            casts.append({"node": node.name, "cast": kind, "value": source.name if source else None,
                          "from": str(source.place) if source is not None and source.place else None,
                          "to": str(node.output().place) if node.output().place else None,
                          "bytes": _written_bytes(node.output())})
        elif ctx is not None and place is not None and place.startswith(f"{HOST.name}/"):
            fallback = host_fallback(ctx, node)
            if fallback is not None:
                entry["fallback"] = fallback
    by_kind: dict[str, int] = {}
    for cast in casts:
        by_kind[cast["cast"]] = by_kind.get(cast["cast"], 0) + 1
    return {"nodes": nodes, "places": dict(sorted(per_place.items(), key=lambda kv: -kv[1])), "casts": casts,
            "counts": {"nodes": len(nodes), "annotated": sum(1 for n in nodes if n["kernel"]), **by_kind}}


@register_pass(name="place_report", kind=PassKind.STMT, level=1,
               description="report each node's kernel and place, node counts per place and the casts; record "
                           "the valid places and pipeline in the model metadata")
def place_report(ctx: PassContext) -> PassResult:
    from worker.engine.passes.pipelines import get_pipeline, pass_names

    section = kernels_section(ctx.graph, ctx)
    ctx.report["kernels"] = section
    pipeline = get_pipeline(ctx.options.pipeline)
    names = [n for n in pass_names(pipeline.steps_for(ctx.options)) if n not in ctx.options.disabled_passes]
    ctx.model.metadata["mirserve.valid_places"] = str(ctx.places)
    ctx.model.metadata["mirserve.pipeline"] = f"{ctx.options.pipeline}: {','.join(names)}"
    result = PassResult()
    result.data.update(section["counts"])
    return result
