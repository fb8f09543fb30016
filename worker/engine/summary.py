"""The readable side of a report: what changed, what runs where, what it costs, whether it still computes the same.

A report is 100-200 KB of JSON; the questions people ask of it are few. ``build_summary`` answers them as a
small dict (kept in the report as ``summary``, in the job row, and printed by ``--json``), and
``render_summary`` prints it as terminal tables that wrap to the terminal's width, the way onnxslim prints its
before/after op counts and Paddle-Lite's ``opt`` prints what runs where:

- op types before and after (top-level graph, like the node counts), total row last;
- nodes per place, casts by kind (io_copy, calib, layout) with the bytes they write;
- host fallbacks: nodes on a host place although the user listed no host place, by op, with the kind of
  reason (no kernel, precision, layout, constraints, rewrite: an op a rewrite made) and the reason; a node
  that fell back where a place the user listed was possible is also a warning;
- per memory space: weights, planned arena, its lower bound, the Paddle-Lite-style figure, no reuse;
- MACs, the verification figures, and warnings (passes or plugins that failed, a skipped verification).

It reads only the report (and, for the fallback reasons, a kernel lookup), so the remote CLI prints a job's
summary exactly as a local run does.
"""
from __future__ import annotations

import io
from collections import Counter
from typing import Any, Callable, Iterable, Mapping

from worker.engine.memory.liveness import is_view_op
from worker.engine.places import HOST

#: Cast ops of the ``mirserve`` domain: never counted as fallbacks, counted by kind instead.
CAST_OPS = {"mirserve.io_copy": "io_copy", "mirserve.calib": "calib", "mirserve.layout": "layout"}
CAST_KINDS = ("io_copy", "calib", "layout")

#: ``(qualified op, target) -> whether the target registers any kernel for that op``.
KernelLookup = Callable[[str, str], bool]


def op_type_counts(nodes: Iterable[Any]) -> dict[str, int]:
    """``{"Conv": 53, "mirserve.FusedConvRelu": 9, ...}`` over the given IR nodes, most frequent first."""
    counts = Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in nodes)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def build_summary(report: Mapping[str, Any], has_kernel: KernelLookup | None = None) -> dict[str, Any]:
    """The summary of an optimize report; parts the run did not produce are empty, never missing."""
    model = report.get("model") or {}
    before, after = model.get("input") or {}, model.get("output") or {}
    kernels = report.get("kernels") or {}
    memory = report.get("memory") or {}
    user_targets = _user_targets(report)
    fallbacks = _host_fallbacks(kernels.get("nodes") or [], user_targets, has_kernel,
                                {*(before.get("op_types") or {}), *(before.get("op_types_in_bodies") or {})},
                                (report.get("placement") or {}).get("host_by_choice") or {})
    return {
        "nodes": {"before": before.get("nodes"), "after": after.get("nodes")},
        "bytes": {"before": before.get("bytes"), "after": after.get("bytes")},
        "seconds": report.get("seconds"),
        "op_types": _op_type_rows(before.get("op_types") or {}, after.get("op_types") or {}),
        "nodes_per_place": dict(kernels.get("places") or {}),
        "casts": _cast_counts(kernels.get("casts") or []),
        "cast_bytes": _cast_bytes(kernels.get("casts") or []),
        "host_fallbacks": fallbacks,
        "memory_spaces": _memory_spaces(memory),
        "io_bytes": memory.get("io_bytes"),
        "unplanned": [{"space": u.get("space"), "reason": u.get("reason")} for u in memory.get("unplanned") or []],
        "macs": (memory.get("macs") or {}).get("total"),
        "macs_known": (memory.get("macs") or {}).get("known_total"),
        "macs_unknown_nodes": len((memory.get("macs") or {}).get("unknown") or []),
        "macs_unknown": _macs_unknown((memory.get("macs") or {}).get("unknown") or []),
        "verification": _verification(report.get("verification")),
        "warnings": _warnings(report, fallbacks),
        "cut": report.get("cut"),
        "placement": _placement(report.get("placement")),
        "precision_fallback": _precision_fallback(report.get("precision_fallback")),
        "storage_fallback": _storage_fallback(report.get("storage_fallback")),
    }


def _precision_fallback(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The nodes auto mixed precision kept in fp32 (sorted names), the precisions they were taken out of and the
    verification runs it took, or None."""
    if not section:
        return None
    return {"nodes": sorted(str(n.get("node")) for n in section.get("nodes") or []),
            "precisions": list(section.get("precisions") or ["fp16"]), "runs": section.get("runs"),
            "seconds": section.get("seconds")}


def _storage_fallback(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The weights fp16_storage kept in fp32 after the output did not verify with them in fp16 (sorted names)
    and the verification runs that took, or None."""
    if not section:
        return None
    return {"weights": sorted(str(w.get("weight")) for w in section.get("weights") or []),
            "runs": section.get("runs"), "seconds": section.get("seconds")}


def _placement(plan: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The kernel pick's plan against Paddle-Lite's greedy pick: cost units and casts (count, bytes)."""
    if not plan:
        return None
    return {"cost": plan.get("cost"), "greedy_cost": plan.get("greedy_cost"), "lower_bound": plan.get("lower_bound"),
            "method": plan.get("method"),
            "casts": {k: (plan.get("casts") or {}).get(k) for k in ("count", "bytes")},
            "greedy_casts": {k: (plan.get("greedy_casts") or {}).get(k) for k in ("count", "bytes")}}


#: How many distinct reasons for unknown MACs the summary quotes.
MACS_REASONS = 3


def _macs_unknown(unknown: list) -> list[str]:
    """The distinct reasons why MACs are unknown (the first few), each with a node it applies to."""
    reasons: dict[str, str] = {}
    for entry in unknown:
        if isinstance(entry, Mapping):
            reasons.setdefault(str(entry.get("reason")), str(entry.get("node")))
        else:  # a report written before reasons were given
            reasons.setdefault("its shapes are unknown", str(entry))
    return [f"{reason} (node {node})" for reason, node in list(reasons.items())[:MACS_REASONS]]


def _user_targets(report: Mapping[str, Any]) -> set[str]:
    places = str((report.get("options") or {}).get("places") or "")
    return {p.strip().split("/", 1)[0] for p in places.split(",") if p.strip()}


def _op_type_rows(before: Mapping[str, int], after: Mapping[str, int]) -> list[dict[str, Any]]:
    ops = set(before) | set(after)
    rows = [{"op": op, "before": int(before.get(op, 0)), "after": int(after.get(op, 0))} for op in ops]
    return sorted(rows, key=lambda r: (-r["before"], -r["after"], r["op"]))


def _cast_counts(casts: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = Counter(str(c.get("cast")) for c in casts)
    return {kind: counts.get(kind, 0) for kind in CAST_KINDS} | {k: v for k, v in counts.items()
                                                                    if k not in CAST_KINDS}


def _cast_bytes(casts: Iterable[Mapping[str, Any]]) -> dict[str, int | None]:
    """Bytes the casts of each kind write; None for a kind when some of its casts have no static shape."""
    totals: dict[str, int | None] = {}
    for cast in casts:
        kind, size = str(cast.get("cast")), cast.get("bytes")
        if kind not in totals:
            totals[kind] = 0
        totals[kind] = None if size is None or totals[kind] is None else totals[kind] + int(size)
    return {kind: totals.get(kind, 0) for kind in CAST_KINDS} | {k: v for k, v in totals.items()
                                                                   if k not in CAST_KINDS}


def _host_fallbacks(nodes: Iterable[Mapping[str, Any]], user_targets: set[str],
                    has_kernel: KernelLookup | None, ops_before: set[str] = frozenset(),
                    by_choice: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Nodes that landed on a host place the user did not ask for, grouped by op, place and the kind of reason.

    The reason is the one place_report recorded for the node, else one read off ``has_kernel`` (``by_choice``:
    op types the placement plan put on the host although a user's target runs them, kind ``plan``); an op the
    input model did not have (a fused op) was made by a rewrite, which is then the kind of reason (unless a
    listed place runs it: then the plan or the pick, not the rewrite, put it on host).
    """
    if HOST.name in user_targets:
        return []
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for node in nodes:
        place, op = node.get("place") or "", str(node.get("op"))
        if place.split("/", 1)[0] != HOST.name or op in CAST_OPS:
            continue
        kernel_op = _kernel_op(node) or op
        fallback = node.get("fallback") if isinstance(node.get("fallback"), Mapping) else None
        if fallback is not None:
            kind, reason, possible = str(fallback.get("kind")), str(fallback.get("reason")), bool(
                fallback.get("user_place"))
        else:
            reason, possible = _fallback_reason(kernel_op, sorted(user_targets), has_kernel), False
            kind = "no kernel" if reason.startswith("no kernel") else "constraints"
            if (by_choice or {}).get(op):
                kind, possible = "plan", True
                reason = (f"the placement plan chose the host: {_join(sorted(user_targets))} could run it, but the "
                          f"casts around it there cost more")
        # a view no listed target registers (ARM leaves Reshape/Flatten to the host, as Paddle-Lite does) is
        # where the same op of the input model would be: no place was lost to the rewrite that made it
        made_view = is_view_op(op, "") and kind == "no kernel"
        if ops_before and op not in ops_before and not op.startswith("mirserve.Nhwc") and kind not in ("plan", "pick") \
                and not made_view:
            kind, reason = "rewrite", f"a rewrite made {op}: {reason}"
        group = groups.setdefault((kernel_op, place, kind), {"names": [], "reason": reason, "possible": 0})
        group["names"].append(str(node.get("node")))
        group["possible"] += possible
    found = []
    for (op, place, kind), group in sorted(groups.items(), key=lambda kv: (-len(kv[1]["names"]), kv[0])):
        names = group["names"]
        found.append({"op": op, "place": place, "nodes": len(names), "examples": names[:3], "kind": kind,
                      "reason": group["reason"], "user_place_possible": group["possible"]})
    return found


def _kernel_op(node: Mapping[str, Any]) -> str | None:
    """The op a kernel id names (``host:mirserve.FusedConvRelu:1-:fp32:nchw``): NHWC forms share their kernel."""
    kernel = node.get("kernel")
    parts = kernel.split(":") if isinstance(kernel, str) else []
    return parts[1] if len(parts) > 2 else None


def _fallback_reason(op: str, targets: list[str], has_kernel: KernelLookup | None) -> str:
    if has_kernel is None or not targets:
        return "the kernel pick found no better place"
    missing = [t for t in targets if not has_kernel(op, t)]
    if missing == targets:
        return f"no kernel for {op} on {_join(targets)}"
    present = [t for t in targets if t not in missing]
    return (f"{_join(present)} has {op} kernels, but none accepts this node's element types, attributes or "
            f"opset" + (f"; {_join(missing)} has none" if missing else ""))


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _memory_spaces(memory: Mapping[str, Any]) -> list[dict[str, Any]]:
    weights = memory.get("weights_bytes") or {}
    paddle = memory.get("paddle_lite_style_bytes") or {}
    arenas = {a.get("space"): a for a in memory.get("arenas") or []}
    formulas = ((memory.get("symbolic") or {}).get("spaces")) or {}
    rows = []
    for space in list(arenas) + [s for s in weights if s not in arenas]:
        arena = arenas.get(space) or {}
        rows.append({"space": space, "weights_bytes": weights.get(space, 0),
                     "arena_bytes": arena.get("arena_bytes"), "lower_bound_bytes": arena.get("lower_bound_bytes"),
                     "ratio": arena.get("ratio"), "paddle_lite_style_bytes": paddle.get(space),
                     "no_reuse_bytes": arena.get("naive_bytes"), "peak_step": arena.get("peak_step"),
                     "peak_node": arena.get("peak_node"),
                     "arena_formula": ((formulas.get(space) or {}).get("arena_bytes") or {}).get("formula")})
    return rows


def _verification(verification: Mapping[str, Any] | None) -> dict[str, Any]:
    if not verification:
        return {"passed": None, "skipped": "verification was turned off"}
    outputs = [o for o in verification.get("outputs") or [] if isinstance(o, Mapping)]
    abs_diffs = [o["max_abs_diff"] for o in outputs if isinstance(o.get("max_abs_diff"), (int, float))]
    rel_diffs = [o["max_rel_diff"] for o in outputs if isinstance(o.get("max_rel_diff"), (int, float))]
    return {"passed": verification.get("passed"), "skipped": verification.get("skipped"),
            "runs": verification.get("runs"), "outputs": len({o.get("name") for o in outputs}),
            "max_abs_diff": max(abs_diffs) if abs_diffs else None,
            "max_rel_diff": max(rel_diffs) if rel_diffs else None,
            "rtol": verification.get("rtol"), "atol": verification.get("atol"),
            "shapes": verification.get("shapes") if verification.get("dims") else None,
            "method": verification.get("method"), "method_summary": verification.get("summary"),
            "regions_refused": verification.get("regions_refused"), "values": verification.get("values")}


def _warnings(report: Mapping[str, Any], fallbacks: Iterable[Mapping[str, Any]] = ()) -> list[str]:
    warnings = [str(w.get("message", w)) if isinstance(w, Mapping) else str(w) for w in report.get("warnings") or []]
    planned = [f for f in fallbacks if f.get("kind") == "plan"]
    if planned:
        count = sum(int(f["nodes"]) for f in planned)
        what = "; ".join(f"{f['op']} ({', '.join(f['examples'][:2])})" for f in planned[:5])
        warnings.append(f"{count} node(s) on host by the placement plan although a place you listed could run "
                        f"them (the casts there cost more): {what}")
    avoidable = [f for f in fallbacks if f.get("user_place_possible") and f.get("kind") != "plan"]
    if avoidable:
        count = sum(int(f["user_place_possible"]) for f in avoidable)
        what = "; ".join(f"{f['op']} ({f['kind']}: {', '.join(f['examples'][:2])})" for f in avoidable[:5])
        warnings.append(f"{count} node(s) fell back to host where a place you listed was possible: {what}")
    rewritten = [f for f in fallbacks if f.get("kind") == "rewrite"]
    if rewritten:
        count = sum(int(f["nodes"]) for f in rewritten)
        what = "; ".join(f"{f['op']} ({', '.join(f['examples'][:2])})" for f in rewritten[:5])
        warnings.append(f"{count} node(s) fell back to host on ops a rewrite made, which no place you listed "
                        f"runs: {what}")
    for plugin in report.get("plugins") or []:
        if plugin.get("status") == "failed":
            warnings.append(f"plugin {plugin.get('origin')} failed to load and was not used: {plugin.get('error')}")
    verification = report.get("verification") or {}
    if verification.get("passed") is None and verification.get("skipped"):
        warnings.append(f"not verified: {verification['skipped']}")
    return warnings


# --- terminal rendering -------------------------------------------------------------------------------------------

SECTIONS = ("op_types", "places", "host_fallbacks", "memory", "figures", "warnings")


def render_summary(summary: Mapping[str, Any], width: int | None = None,
                   sections: Iterable[str] = SECTIONS) -> str:
    """The summary as plain-text tables no wider than ``width`` (default: the terminal's, or 80 when piped);
    ``sections`` picks some of them."""
    return _render(_blocks(summary, set(sections)), width)


def render_table(title: str, columns: list[str], rows: list[list[Any]], width: int | None = None,
                 keep_whole: Iterable[str] = ()) -> str:
    """One table in the summary's style: left-aligned text columns that fold to fit, except ``keep_whole``."""
    whole = set(keep_whole)
    return _render([_table(title, [(c, "whole" if c in whole else "left") for c in columns], rows)], width)


def _render(blocks: list[Any], width: int | None) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=width or _terminal_width(), no_color=True, highlight=False,
                      emoji=False, markup=False, soft_wrap=False)
    for index, block in enumerate(blocks):
        if index:
            console.print()
        console.print(block)
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines())


def _terminal_width() -> int:
    import shutil

    return max(40, shutil.get_terminal_size((80, 24)).columns)


def _blocks(summary: Mapping[str, Any], sections: set[str]) -> list[Any]:
    blocks: list[Any] = []
    if "op_types" in sections and summary.get("op_types"):
        blocks.append(_op_table(summary))
    if "places" in sections and summary.get("nodes_per_place"):
        blocks.append(_place_table(summary))
    if "host_fallbacks" in sections and summary.get("host_fallbacks"):
        blocks.append(_fallback_table(summary["host_fallbacks"]))
    if "memory" in sections and summary.get("memory_spaces"):
        blocks.append(_memory_table(summary))
    if "figures" in sections:
        blocks.append(_figures_table(summary))
    if "warnings" in sections and summary.get("warnings"):
        blocks.append(_table("warnings", [("warning", "left")], [[w] for w in summary["warnings"]]))
    return blocks


def _table(title: str, columns: list[tuple[str, str]], rows: list[list[Any]], footer: list[Any] | None = None):
    """A borderless table; right-aligned (figure) and "whole" columns never wrap, text columns fold to fit."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_footer=footer is not None,
                  show_edge=False, pad_edge=False)
    for index, (name, justify) in enumerate(columns):
        table.add_column(name, justify="left" if justify == "whole" else justify, overflow="fold",
                         no_wrap=justify in ("right", "whole"), footer=str(footer[index]) if footer is not None else "")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    return table


def _op_table(summary: Mapping[str, Any]):
    rows = [[r["op"], _count(r["before"]), _count(r["after"]), _change(r["before"], r["after"])]
            for r in summary["op_types"]]
    nodes = summary.get("nodes") or {}
    footer = ["total", _count(nodes.get("before")), _count(nodes.get("after")),
              _change(nodes.get("before"), nodes.get("after"))]
    return _table("op types", [("op type", "left"), ("before", "right"), ("after", "right"), ("change", "right")],
                  rows, footer)


def _place_table(summary: Mapping[str, Any]):
    places = summary["nodes_per_place"]
    rows = [[place, _count(count)] for place, count in places.items()]
    return _table("nodes per place", [("place", "left"), ("nodes", "right")], rows,
                  ["total", _count(sum(places.values()))])


def _fallback_table(fallbacks: list[Mapping[str, Any]]):
    rows = [[f["op"], f["place"], _count(f["nodes"]), f.get("kind", ""), f["reason"]] for f in fallbacks]
    return _table("host fallbacks", [("op", "left"), ("place", "left"), ("nodes", "right"), ("why", "left"),
                                     ("reason", "left")], rows)


def _memory_table(summary: Mapping[str, Any]):
    """One column per memory space (there are few), one row per figure, so it fits a narrow terminal."""
    spaces = summary["memory_spaces"]
    figures = [("weights", lambda s: _bytes(s.get("weights_bytes"))),
               ("arena (planned activations)", lambda s: _bytes(s.get("arena_bytes"))),
               ("lower bound (no plan does better)", lambda s: _bytes(s.get("lower_bound_bytes"))),
               ("arena / lower bound", lambda s: "-" if s.get("ratio") is None else f"{s['ratio']:.3f}"),
               ("Paddle-Lite-style plan", lambda s: _bytes(s.get("paddle_lite_style_bytes"))),
               ("no reuse", lambda s: _bytes(s.get("no_reuse_bytes"))),
               ("peak", lambda s: "-" if s.get("peak_step") is None
                else f"step {s['peak_step']} ({s.get('peak_node')})")]
    if any(s.get("arena_formula") for s in spaces):  # open input dims: the arena at any size
        figures.append(("arena as a formula of the open dims", lambda s: s.get("arena_formula") or "-"))
    rows = [[name, *(show(space) for space in spaces)] for name, show in figures]
    return _table("memory per space", [("figure", "left"), *((str(s["space"]), "left") for s in spaces)], rows)


def _figures_table(summary: Mapping[str, Any]):
    rows = [["model bytes", f"{_bytes(summary['bytes'].get('before'))} -> {_bytes(summary['bytes'].get('after'))}"]]
    cut = summary.get("cut")
    if cut:
        rows.append(["cut", f"{', '.join(cut['inputs'])} -> {', '.join(cut['outputs'])}: {cut['nodes']:,} of "
                            f"{cut['nodes_before']:,} nodes kept"])
    if summary.get("nodes_per_place"):
        casts, sizes = summary.get("casts") or {}, summary.get("cast_bytes") or {}
        rows.append(["casts", ", ".join(f"{kind} {count}" + (f" ({_bytes(sizes[kind])})" if count and sizes.get(kind)
                                                             else "") for kind, count in casts.items()) or "none"])
    plan = summary.get("placement")
    if plan and None in (plan.get("cost"), plan.get("greedy_cost")):
        rows.append(["placement cost", "not priced: the cost model has no cast chain for some value the cast "
                                       f"passes placed; casts {plan['casts']['count']}, "
                                       f"{_bytes(plan['casts']['bytes'])}"])
    elif plan:
        rows.append(["placement cost", f"{plan['cost']:,.0f} (greedy pick {plan['greedy_cost']:,.0f}, lower bound "
                                       f"{plan['lower_bound']:,.0f}); casts {plan['casts']['count']}, "
                                       f"{_bytes(plan['casts']['bytes'])} (greedy pick "
                                       f"{plan['greedy_casts']['count']}, {_bytes(plan['greedy_casts']['bytes'])})"])
    if summary.get("macs") is not None:
        rows.append(["MACs", f"{summary['macs']:,}"])
    elif summary.get("macs_unknown_nodes"):
        known = summary.get("macs_known")
        text = f"unknown: {summary['macs_unknown_nodes']} node(s) cannot be counted"
        if known:
            text += f" ({known:,} in the others)"
        reasons = summary.get("macs_unknown") or []
        rows.append(["MACs", text + (": " + "; ".join(reasons) if reasons else "")])
    if summary.get("io_bytes") is not None:
        rows.append(["inputs and outputs", _bytes(summary["io_bytes"])])
    for entry in summary.get("unplanned") or []:
        rows.append([f"not planned ({entry['space']})", entry["reason"]])
    rows.append(["verification", _verification_text(summary.get("verification") or {})])
    fallback = summary.get("precision_fallback")
    if fallback:
        rows.append(["kept in fp32", f"{len(fallback['nodes'])} node(s) after "
                                     f"{' and '.join(fallback.get('precisions') or ['fp16'])} failed verification "
                                     f"({fallback['runs']} verification run(s)): {', '.join(fallback['nodes'])}"])
    storage = summary.get("storage_fallback")
    if storage:
        rows.append(["weights in fp32", f"{len(storage['weights'])} weight(s) kept after fp16 storage failed "
                                        f"verification ({storage['runs']} verification run(s)): "
                                        f"{', '.join(storage['weights'])}"])
    if summary.get("seconds") is not None:
        rows.append(["seconds", f"{summary['seconds']:.2f}"])
    return _table("figures", [("figure", "left"), ("value", "left")], rows)


def _verification_text(verification: Mapping[str, Any]) -> str:
    if verification.get("passed") is None:
        return f"not verified: {verification.get('skipped') or 'no verification ran'}"
    verdict = "passed" if verification["passed"] else "FAILED"
    diff = verification.get("max_abs_diff")
    figures = f"max abs diff {diff:.3g}" if isinstance(diff, (int, float)) else "no numeric outputs"
    shapes = verification.get("shapes")
    where = (" at " + " and ".join(", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in s.items())
                                   for s in shapes)) if shapes else ""
    if verification.get("values"):  # inputs that steer the model: each of their values had a run
        from worker.engine.sample_values import describe

        where += f" ({describe(verification['values'])})"
    if verification.get("method") == "regions":  # the values compared are the regions' (method_summary)
        return (f"{verdict}, {verification.get('method_summary')}, on {verification.get('runs')} run(s){where} "
                f"(rtol {verification.get('rtol')}, atol {verification.get('atol')})")
    refused = (f"; not by regions: {verification['regions_refused']}" if verification.get("regions_refused")
               else "")
    return (f"{verdict} on {verification.get('runs')} run(s) of {verification.get('outputs')} output(s){where}, "
            f"{figures} (rtol {verification.get('rtol')}, atol {verification.get('atol')}){refused}")


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def _change(before: Any, after: Any) -> str:
    if not isinstance(before, int) or not isinstance(after, int) or before == after:
        return ""
    return f"{after - before:+,}"


def _bytes(value: Any) -> str:
    from worker.engine.memory.timeline_svg import human_bytes

    return "-" if value is None else human_bytes(value)
