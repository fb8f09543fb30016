"""support_check: every op must have a kernel in some valid place (like `opt`'s check), told truthfully.

    an op of a domain no rewrite touches, with no kernel  ->  one UnsupportedOpsError listing every such op
                                                              type, its node names, the places tried
    a standard or mirserve op with no kernel              ->  left to kernel pick: folding and fusions may
                                                              remove it (BatchNormalization, Constant) or
                                                              make it (mirserve.Fused*), so only the graph
                                                              kernel pick sees is the truth
    --check-support                                       ->  the pipeline runs up to kernel pick and
                                                              ``placement_support`` reports, per op type,
                                                              the places its nodes run on or why none

An op is supported when some kernel of its type, domain and opset runs in one of the valid places (its
target, and its precision and layout or ``any``). Whether that kernel takes the node's element types is
kernel pick's business, after the graph rewrites.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from worker.engine.errors import UnsupportedOpsError
from worker.engine.ir import Graph
from worker.engine.kernels import KernelTable
from worker.engine.kernels.pick import first_place
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.passes.support.placement import node_opset
from worker.engine.places import HOST, ValidPlaces


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


#: Domains whose ops the rewrites remove and create: a missing kernel for one of them is judged at kernel pick.
REWRITTEN_DOMAINS = frozenset({"", "ai.onnx", "mirserve"})
#: The pass whose picks ``placement_support`` reads.
KERNEL_PICK = "static_kernel_pick"


def _domain(op: str) -> str:
    return op.rpartition(".")[0]


def kernel_pick_will_run(ctx: PassContext) -> bool:
    """Whether this run goes on to kernel pick (planned, and not skipped by level, option or target)."""
    from worker.engine.passes.manager import skip_reason
    from worker.engine.passes.registry import REGISTRY

    if KERNEL_PICK not in ctx.planned_passes or KERNEL_PICK not in REGISTRY:
        return False
    return skip_reason(REGISTRY.get(KERNEL_PICK).info, ctx) is None


@register_pass(name="support_check", kind=PassKind.DEBUG, level=0,
               description="fail early, listing every op type of a domain no rewrite touches with no kernel "
                           "in any valid place; standard and mirserve ops are judged at kernel pick, after "
                           "the rewrites (with --check-support: only report)")
def support_check(ctx: PassContext) -> PassResult:
    result = PassResult()
    missing = unsupported(ctx.kernels, ctx.graph, ctx.model.opset, ctx.places)
    deferred = kernel_pick_will_run(ctx)
    fatal = {op: nodes for op, nodes in missing.items() if not deferred or _domain(op) not in REWRITTEN_DOMAINS}
    ops = sorted({f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in ctx.graph.all_nodes()})
    ctx.report["support"] = {
        "places": [str(p) for p in ctx.places], "stage": "before_rewrites", "supported": not missing,
        "op_types": len(ops),
        "unsupported": [{"op": op, "nodes": nodes} for op, nodes in sorted(missing.items())],
    }
    result.data["unsupported_op_types"] = len(fatal)
    result.data["left_to_kernel_pick"] = sorted(set(missing) - set(fatal))
    if fatal and not ctx.options.check_support_only:
        raise UnsupportedOpsError(message(fatal, ctx.places))
    return result


_ELSEWHERE = re.compile(r"^\S+ runs in (\S+), which no valid place allows$")


def _why_none(reasons: list[str]) -> str:
    """Kernel pick's refusals, the kernels that run only in places not asked for given as one list."""
    elsewhere = [m.group(1) for m in map(_ELSEWHERE.match, reasons) if m]
    other = [r for r in reasons if not _ELSEWHERE.match(r)]
    if elsewhere:
        other.insert(0, f"its kernels run in {', '.join(dict.fromkeys(elsewhere))}, which no valid place allows")
    return "; ".join(other)


def placement_support(ctx: PassContext, failures: Mapping[str, Mapping[str, Any]],
                      before: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``support`` section after kernel pick: per op type of the graph as it will run, the places its
    nodes were picked for, and the op types no valid place runs, with kernel pick's reasons.

    ``failures`` is kernel pick's (op -> nodes, reasons); ``before`` the section support_check made before
    the rewrites, whose unsupported op types the rewrites removed are listed as such.
    """
    host = HOST.name
    user_targets = {p.strip().split("/", 1)[0] for p in ctx.options.places.split(",") if p.strip()}
    rows: dict[str, dict[str, Any]] = {}
    for node in ctx.graph.all_nodes():
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        row = rows.setdefault(op, {"op": op, "nodes": 0, "places": {}, "note": None})
        row["nodes"] += 1
        if node.place is not None:
            place = str(node.place)
            row["places"][place] = row["places"].get(place, 0) + 1
    for op, entry in failures.items():
        rows.setdefault(op, {"op": op, "nodes": len(entry["nodes"]), "places": {}, "note": None})
    targets = " or ".join(sorted(ctx.places.targets))
    reasons = {op: list(entry["reasons"]) or [f"no kernel for {op} on {targets}"] for op, entry in failures.items()}
    by_choice = (ctx.report.get("placement") or {}).get("host_by_choice") or {}
    for op, row in rows.items():
        if op in failures:
            row["note"] = "no place: " + _why_none(reasons[op])
        elif row["places"] and all(p.startswith(host + "/") for p in row["places"]) and host not in user_targets:
            domain, _, name = op.rpartition(".")
            on_user = ctx.kernels.has_kernel(name, domain, sorted(user_targets))
            if by_choice.get(op) == row["nodes"]:
                row["note"] = (f"host by the placement plan: {', '.join(sorted(user_targets))} could run these "
                               f"nodes, but the casts around them there cost more than the host's kernel")
                continue
            row["note"] = ("host fallback: " + (f"no kernel of {', '.join(sorted(user_targets))} takes these "
                                                 f"nodes (element types, precision or layout)" if on_user else
                                                 f"no kernel for {op} on {', '.join(sorted(user_targets))}"))
        row["places"] = dict(sorted(row["places"].items(), key=lambda item: -item[1]))
    removed = sorted(u["op"] for u in (before or {}).get("unsupported", []) if u["op"] not in rows)
    return {"places": [str(p) for p in ctx.places], "stage": "kernel_pick", "supported": not failures,
            "op_types": len(rows), "ops": sorted(rows.values(), key=lambda r: r["op"]),
            "unsupported": [{"op": op, "nodes": list(e["nodes"]), "reasons": reasons[op]}
                            for op, e in sorted(failures.items())],
            "removed_by_rewrites": removed}
