"""place_report: the report's ``kernels`` section and the model metadata that records how it was placed.

    report["kernels"] = {"nodes": [{node, op, kernel, place}...], "places": {place: node count},
                         "casts": [{node, cast, from, to, value}...], "counts": {...}}
    model metadata: mirserve.valid_places = "arm/fp16/nhwc,arm/fp32/nchw,host/fp16/nhwc,host/fp32/nchw"
                    mirserve.pipeline     = "default: type_inference,support_check,...,place_report,..."
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.casts import cast_kind
from worker.engine.passes.support.placement import KERNEL_KEY, PLACE_KEY


def kernels_section(graph) -> dict:
    nodes, casts, per_place = [], [], {}
    for node in graph.all_nodes():
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        place = node.metadata.get(PLACE_KEY)
        nodes.append({"node": node.name, "op": op, "kernel": node.metadata.get(KERNEL_KEY), "place": place})
        if place is not None:
            per_place[place] = per_place.get(place, 0) + 1
        kind = cast_kind(node)
        if kind is not None:
            source = node.input(0)
            casts.append({"node": node.name, "cast": kind, "value": source.name if source else None,
                          "from": str(source.place) if source is not None and source.place else None,
                          "to": str(node.output().place) if node.output().place else None})
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

    section = kernels_section(ctx.graph)
    ctx.report["kernels"] = section
    pipeline = get_pipeline(ctx.options.pipeline)
    names = [n for n in pass_names(pipeline.steps_for(ctx.options)) if n not in ctx.options.disabled_passes]
    ctx.model.metadata["mirserve.valid_places"] = str(ctx.places)
    ctx.model.metadata["mirserve.pipeline"] = f"{ctx.options.pipeline}: {','.join(names)}"
    result = PassResult()
    result.data.update(section["counts"])
    return result
