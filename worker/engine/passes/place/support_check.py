"""support_check: before any rewriting, every op must have a kernel in some valid place (like `opt`'s check).

    unsupported ops  ->  one UnsupportedOpsError listing every op type, its node names, the places tried
    --check-support  ->  the same findings in the report's ``support`` section, and the run stops there

An op is supported when some kernel of its type, domain and opset runs in one of the valid places (its
target, and its precision and layout or ``any``). Whether that kernel takes the node's element types is
kernel pick's business, after the graph rewrites.
"""
from __future__ import annotations

from worker.engine.errors import UnsupportedOpsError
from worker.engine.ir import Graph
from worker.engine.kernels import KernelTable
from worker.engine.kernels.pick import first_place
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.placement import node_opset
from worker.engine.places import ValidPlaces


def unsupported(table: KernelTable, graph: Graph, opset_of, places: ValidPlaces) -> dict[str, list[str]]:
    """Op (qualified) -> names of its nodes that no kernel of the valid places runs, bodies included."""
    missing: dict[str, list[str]] = {}
    verdicts: dict[tuple[str, str, int], bool] = {}
    for node in graph.all_nodes():
        opset = node_opset(opset_of, node)
        key = (node.op_type, node.domain, opset)
        if key not in verdicts:
            kernels = table.kernels(node.op_type, node.domain, opset=opset, targets=places.targets)
            verdicts[key] = any(first_place(k, places) is not None for k in kernels)
        if not verdicts[key]:
            op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            missing.setdefault(op, []).append(node.name)
    return missing


def message(missing: dict[str, list[str]], places: ValidPlaces) -> str:
    parts = []
    for op, nodes in sorted(missing.items()):
        shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
        parts.append(f"{op} (node{'s' if len(nodes) > 1 else ''} {shown})")
    return (f"{len(missing)} op type{'s' if len(missing) > 1 else ''} ha{'ve' if len(missing) > 1 else 's'} "
            f"no kernel in any valid place ({places}): {'; '.join(parts)}. `mirserve targets` lists each "
            f"target's kernels")


@register_pass(name="support_check", kind=PassKind.DEBUG, level=0,
               description="fail early, listing every op type with no kernel in any valid place "
                           "(with --check-support: only report)")
def support_check(ctx: PassContext) -> PassResult:
    result = PassResult()
    missing = unsupported(ctx.kernels, ctx.graph, ctx.model.opset, ctx.places)
    ops = sorted({f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in ctx.graph.all_nodes()})
    ctx.report["support"] = {
        "places": [str(p) for p in ctx.places], "supported": not missing, "op_types": len(ops),
        "unsupported": [{"op": op, "nodes": nodes} for op, nodes in sorted(missing.items())],
    }
    result.data["unsupported_op_types"] = len(missing)
    if missing and not ctx.options.check_support_only:
        raise UnsupportedOpsError(message(missing, ctx.places))
    return result
