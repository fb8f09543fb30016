"""The engine's command line: ``mirserve optimize`` and ``mirserve passes``, without the server.

``build_parser`` is public so that the service (``app.cli``) can add its own commands to the same program;
the engine never imports the service. Errors a user can fix print one line and exit 1; usage errors exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Sequence

from worker import __version__
from worker.engine.errors import MirserveError, OptionsError
from worker.engine.atomic import atomic_path, write_json
from worker.engine.limits import Limits
from worker.engine.options import OptimizeOptions, parse_shape_arg


def build_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The parser and its subparsers object, to which other programs may add commands."""
    parser = argparse.ArgumentParser(
        prog="mirserve", description="Optimize ONNX models for target places (target/precision/layout).")
    parser.add_argument("--version", action="version", version=f"mirserve {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    add_plugin_argument(parser, dest="plugins_global")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_optimize(commands)
    _add_passes(commands)
    _add_targets(commands)
    _add_draw(commands)
    return parser, commands


def _add_optimize(commands) -> None:
    cmd = commands.add_parser("optimize", help="optimize a model and write it with a report",
                              description="Optimize MODEL for the given places and write it to OUT.")
    cmd.add_argument("model", metavar="MODEL", help="the ONNX model to optimize")
    cmd.add_argument("-o", "--output", metavar="OUT",
                     help="where to write the optimized model (required, except with --check-support)")
    add_option_arguments(cmd)
    add_picture_arguments(cmd)
    add_output_arguments(cmd)
    add_plugin_argument(cmd)
    cmd.set_defaults(func=run_optimize, parser=cmd)


def add_option_arguments(cmd: argparse.ArgumentParser, *, check_support: bool = True) -> None:
    """What a run may ask for (``OptimizeOptions``), as flags; ``options_from_args`` reads them back."""
    cmd.add_argument("--places", default=OptimizeOptions.places, metavar="P,P,...",
                     help="valid places in priority order, each target/precision/layout "
                          "(default: %(default)s)")
    cmd.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                     help="static shape of a model input (repeatable; NAME:D0,D1,... and NAME:D0xD1x... too); "
                          "dims left open are chosen for verification and the memory plan")
    cmd.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2),
                     help="0: analysis only; 1: standard-op rewrites; 2: also fused ops (default: 2)")
    cmd.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                     help="do not run this pass (repeatable; `mirserve passes` lists them)")
    cmd.add_argument("--pipeline", default="default", help="named pipeline to run (default: %(default)s)")
    cmd.add_argument("--portable", action="store_true", help="emit standard ONNX ops only")
    cmd.add_argument("--target-opset", type=int, metavar="N",
                     help="raise the model's opset to N first (onnx's version converter), so fusions into newer "
                          "ops apply: Gelu (20), RMSNormalization (23), ...")
    cmd.add_argument("--fp16-storage", action="store_true",
                     help="store float weights as fp16 in the file (a calib to fp32 where a kernel needs it); "
                          "when the output then does not verify, the fewest weights stay in fp32")
    cmd.add_argument("--no-host-fallback", action="store_true",
                     help="do not append host places as the lowest-priority fallback")
    if check_support:
        cmd.add_argument("--check-support", action="store_true",
                         help="run the pipeline up to kernel pick and print, per op type, the place it will run "
                              "on or why none; write nothing (-o not needed); exit 2 when an op has no place")
    cmd.add_argument("--no-verify", action="store_true", help="skip the numeric check against the input")
    cmd.add_argument("--allow-unverified", action="store_true",
                     help="write a model that cannot be verified (onnxruntime cannot run the input) with a "
                          "warning, instead of failing")
    cmd.add_argument("--no-precision-fallback", action="store_true",
                     help="with fp16 or int8 places or --fp16-storage, fail when the output does not verify (by "
                          "default the fewest nodes that must compute in fp32 are moved to an fp32 place, or the "
                          "fewest weights kept in fp32, and it is verified again)")
    cmd.add_argument("--strict", action="store_true",
                     help="fail the run when a pass fails or its result does not verify (by default its "
                          "edits are undone, the run goes on without it and warns)")
    cmd.add_argument("--verify-runs", type=int, default=1, metavar="N",
                     help="random inputs to check (default: 1; at least one per value of an input that steers "
                          "the model, such as a sample rate it compares with 16000)")
    cmd.add_argument("--rtol", type=float, help="relative tolerance (default 1e-4, 1e-2 with fp16)")
    cmd.add_argument("--atol", type=float, help="absolute tolerance (default 1e-5, 1e-3 with fp16)")
    cmd.add_argument("--dim-bound", action="append", default=[], metavar="NAME=N",
                     help="upper bound for a symbolic dim, or for the unknown dims of a data-dependent output "
                          "(NonZero, Unique, ...), used by the memory plan (repeatable)")
    cmd.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                     help="raise (or lower) one of the limits that keep a hostile model from costing anything: "
                          + ", ".join(f"{f.name} (default {f.default})" for f in fields(Limits)) + " (repeatable)")
    cmd.add_argument("--cut-start", action="append", default=[], metavar="VALUE[,VALUE]",
                     help="keep only what lies after these values, which become the graph's inputs (repeatable)")
    cmd.add_argument("--cut-end", action="append", default=[], metavar="VALUE[,VALUE]",
                     help="keep only what lies before these values, which become the graph's outputs (repeatable)")


def add_picture_arguments(cmd: argparse.ArgumentParser) -> None:
    """Files a finished run can be written to besides the model: its memory timeline, trace and report."""
    cmd.add_argument("--memory-timeline", metavar="FILE.svg",
                     help="draw live bytes per step of each memory arena, peak marked, as an SVG")
    cmd.add_argument("--chrome-trace", metavar="FILE.json",
                     help="write the pass trace as a Chrome trace-event file (open it in Perfetto)")
    cmd.add_argument("--report", metavar="REPORT.json", help="write the JSON report here")


def add_output_arguments(cmd: argparse.ArgumentParser) -> None:
    """How a finished run is told: tables (wrapped to the terminal), JSON for machines, or nothing."""
    shown = cmd.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true",
                       help="print the summary as JSON instead of tables (op types, places, casts, memory, ...)")
    shown.add_argument("--quiet", action="store_true", help="print nothing on success")


def _add_draw(commands) -> None:
    from worker.engine.draw import DEFAULT_MAX_NODES, FORMATS

    cmd = commands.add_parser(
        "draw", help="draw a model's graph, nodes coloured by place and casts marked (DOT, or SVG with Graphviz)",
        description="Draw MODEL's top-level graph: each node coloured by its place (the mirserve.place metadata "
                    "of an optimized model), casts drawn as arrows from place to place, a legend of places. "
                    "DOT needs nothing installed; SVG, PNG and PDF need Graphviz's dot program.")
    cmd.add_argument("model", metavar="MODEL", help="the ONNX model (usually an optimized one)")
    cmd.add_argument("-o", "--output", required=True, metavar="OUT",
                     help="where to write the picture; its suffix (.svg, .dot, .png, .pdf) sets the format")
    cmd.add_argument("--format", choices=FORMATS, help="the format, whatever the suffix")
    cmd.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES, metavar="N",
                     help="refuse graphs with more nodes (Graphviz slows down sharply; default: %(default)s)")
    cmd.set_defaults(func=run_draw)


def run_draw(args: argparse.Namespace) -> int:
    from worker.engine.draw import draw

    check_writable(Path(args.output), "output")
    print(f"wrote {draw(args.model, args.output, args.format, args.max_nodes)}")
    return 0


def _add_targets(commands) -> None:
    cmd = commands.add_parser(
        "targets", help="list every target and the kernels its table registers",
        description="List the targets and their kernels: `mirserve targets` every target, `mirserve targets arm` "
                    "one (Paddle-Lite's --print_supported_ops), `mirserve targets --ops` every op against every "
                    "target (--print_all_ops); `mirserve optimize MODEL --check-support` is --print_model_ops.")
    cmd.add_argument("target", nargs="?", metavar="TARGET", help="list only this target's kernels")
    cmd.add_argument("--ops", action="store_true",
                     help="a matrix of every op against every target: the precision/layout forms each runs in")
    cmd.add_argument("--op", metavar="OP", help="only this op (domain-qualified outside the default domain, "
                                                "e.g. Conv or mirserve.FusedConvRelu)")
    cmd.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    cmd.set_defaults(func=run_targets)


def _add_passes(commands) -> None:
    cmd = commands.add_parser("passes", help="list every pass, filter, pipeline and plugin")
    cmd.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_plugin_argument(cmd)
    cmd.set_defaults(func=run_passes)


def add_plugin_argument(parser: argparse.ArgumentParser, dest: str = "plugins") -> None:
    """``--plugin FILE`` (repeatable), on the program and on each command that runs the engine."""
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py", dest=dest,
                        help="load this plugin file too (repeatable; MIRSERVE_PLUGIN_PATH and installed "
                             "packages' mirserve.plugins entry points are always loaded)")


def load_plugins(args: argparse.Namespace) -> None:
    """Load every plugin; one that fails is reported (here, or in `mirserve passes`) and the run goes on."""
    from worker.engine.plugins.loader import PLUGINS

    PLUGINS.add_files([*getattr(args, "plugins_global", []), *getattr(args, "plugins", [])])
    PLUGINS.ensure_loaded()
    if getattr(args, "func", None) is not run_passes:
        for record in PLUGINS.failures():
            print(f"mirserve: warning: plugin {record.origin} failed to load, so its passes, filters and "
                  f"pipelines are unavailable: {record.error}", file=sys.stderr)


def options_from_args(args: argparse.Namespace) -> OptimizeOptions:
    shapes = dict(parse_shape_arg(text) for text in args.input_shape)
    bounds = dict(parse_dim_bound(text) for text in args.dim_bound)
    return OptimizeOptions(
        places=args.places, input_shapes=shapes, opt_level=args.opt_level, dim_bounds=bounds,
        disabled_passes=tuple(args.disable_pass), pipeline=args.pipeline, portable=args.portable,
        verify=not args.no_verify, allow_unverified=args.allow_unverified, verify_runs=args.verify_runs, rtol=args.rtol, atol=args.atol,
        precision_fallback=not getattr(args, "no_precision_fallback", False),
        fp16_storage=args.fp16_storage, host_fallback=not args.no_host_fallback,
        check_support_only=getattr(args, "check_support", False), cut_start=_value_names(args.cut_start),
        cut_end=_value_names(args.cut_end), target_opset=args.target_opset,
        **({"strict": True} if args.strict else {}), limits=Limits().raised(args.limit),
    )


def _value_names(texts: Sequence[str]) -> tuple[str, ...]:
    """``--cut-start a,b --cut-start c`` -> ("a", "b", "c")."""
    return tuple(name.strip() for text in texts for name in text.split(",") if name.strip())


def parse_dim_bound(text: str) -> tuple[str, int]:
    """Parse ``NAME=N`` (the name may itself contain '=')."""
    name, sep, bound = text.rpartition("=")
    if not sep or not name:
        raise OptionsError(f"bad dim bound {text!r}: expected NAME=N", field="dim_bounds")
    try:
        value = int(bound)
    except ValueError:
        raise OptionsError(f"bad dim bound {text!r}: N must be an integer", field="dim_bounds") from None
    if value <= 0:
        raise OptionsError(f"bad dim bound {text!r}: N must be positive", field="dim_bounds")
    return name, value


def run_optimize(args: argparse.Namespace) -> int:
    from worker.engine.api import optimize

    options = options_from_args(args)
    if args.output is None and not options.check_support_only:
        args.parser.error("the following arguments are required: -o/--output (only --check-support writes "
                          "nothing)")
    check_picture_targets(args, options)
    # The user names a local file, so its external data (beside it, never outside its directory) is theirs too.
    report = optimize(args.model, None if options.check_support_only else args.output, options,
                      external_data_dir=Path(args.model).parent)
    write_pictures(report, args)
    print_outcome(report, args)
    support = report.get("support") if options.check_support_only else None
    return UNSUPPORTED_EXIT if support is not None and not support.get("supported") else 0


#: The exit status of ``--check-support`` when some op has no place (1 is an error, 2 a usage error too,
#: as Paddle-Lite's opt does for an unsupported model: a non-zero status scripts can test).
UNSUPPORTED_EXIT = 2


def check_picture_targets(args: argparse.Namespace, options: OptimizeOptions) -> None:
    """Refuse, before a run, files that could not be written after it."""
    for flag in ("memory_timeline", "chrome_trace", "report"):
        if getattr(args, flag):
            check_writable(Path(getattr(args, flag)), flag)
    if args.memory_timeline:
        _check_timeline_target(options)


def write_pictures(report: dict[str, Any], args: argparse.Namespace) -> None:
    """The report, memory timeline and Chrome trace files the flags of ``add_picture_arguments`` ask for."""
    if args.report:
        write_json(Path(args.report), report)
    if args.memory_timeline:
        write_memory_timeline(Path(args.memory_timeline), report)
    if args.chrome_trace:
        write_chrome_trace(Path(args.chrome_trace), report)


def print_outcome(report: dict[str, Any], args: argparse.Namespace, subject: str | None = None) -> None:
    """The one-line outcome and the summary tables, or the summary as JSON, or nothing (--quiet).

    The line starts ``wrote OUT:``, or ``<subject>:`` when given (a remote job whose model was not fetched).
    Warnings (a pass that failed and was undone) go to stderr even with --quiet."""
    for warning in report.get("warnings") or []:
        print(f"mirserve: warning: {terminal_safe(warning['message'])}", file=sys.stderr)
    if args.quiet:
        return
    if args.json:
        print(json.dumps(report.get("summary") or {"support": report.get("support")}, indent=2))
        return
    print(terminal_safe(summary(report, subject)))
    if report.get("summary"):
        from worker.engine.summary import render_summary

        print(terminal_safe(render_summary(report["summary"])))


#: Characters a model's names may hold that a terminal would act on: C0 and C1 controls (escape sequences,
#: bells, carriage returns) and the bidirectional overrides that make text read otherwise than it is.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str, *, lines: bool = True) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``); newlines stay
    only where ``lines`` (a table), else they are escaped too (a one-line error)."""
    unsafe = _UNSAFE if lines else re.compile(_UNSAFE.pattern[:-1] + "\n\t]")
    return unsafe.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def check_writable(path: Path, field: str) -> None:
    """Refuse before optimizing when an output file could not be written, so no run is wasted."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise OptionsError(f"{path}: the directory {directory} does not exist", field=field)


def _check_timeline_target(options: OptimizeOptions) -> None:
    if "memory_plan" in options.disabled_passes:
        raise OptionsError("--memory-timeline needs the memory_plan pass, which --disable-pass turns off",
                           field="memory_timeline")


def write_memory_timeline(path: Path, report: dict[str, Any]) -> None:
    from worker.engine.memory.timeline_svg import render_timeline

    memory = report.get("memory")
    if not memory:
        raise MirserveError(f"no memory timeline to draw: pipeline {report.get('pipeline')!r} did not run the "
                            f"memory_plan pass", field="memory_timeline")
    title = f"live bytes per step: {Path(report['model']['input']['path']).name}"
    with atomic_path(path) as tmp:
        tmp.write_text(render_timeline(memory, title))


def write_chrome_trace(path: Path, report: dict[str, Any]) -> None:
    from worker.engine.trace_events import chrome_trace

    write_json(path, chrome_trace(report))


def summary(report: dict[str, Any], subject: str | None = None) -> str:
    if report["model"]["output"] is None and report.get("support") is not None:
        return support_summary(report["support"])
    model = report["model"]
    line = (f"{subject or 'wrote ' + str(model['output']['path'])}: {model['input']['nodes']} -> "
            f"{model['output']['nodes']} nodes, "
            f"{model['input']['bytes']:,} -> {model['output']['bytes']:,} bytes in {report['seconds']:.2f} s")
    verification = report.get("verification")
    if verification is None:
        return line + "; not verified"
    if verification.get("passed") is None:
        return line + f"; not verified: {verification.get('skipped')}"
    worst = max((o["max_abs_diff"] or 0.0 for o in verification["outputs"]), default=0.0)
    shapes = ""
    if verification.get("dims"):  # dims the user left open: say where it was verified
        from worker.engine.sample_shapes import describe_shapes

        shapes = " at " + " and ".join(describe_shapes(s) for s in verification["shapes"])
    if verification.get("values"):  # inputs that steer the model: each of their values had a run
        from worker.engine.sample_values import describe

        shapes += f" ({describe(verification['values'])})"
    line += f"; verified on {verification['runs']} run(s){shapes}, max abs diff {worst:.3g}"
    fallback = report.get("precision_fallback")
    if fallback and fallback.get("nodes"):
        failed = " and ".join(fallback.get("precisions") or ["fp16"])
        line += (f"\nauto mixed precision: {failed} failed verification, so {len(fallback['nodes'])} node(s) "
                 f"compute in fp32 ({fallback['runs']} verification run(s) to find them):")
        line += _listed([f"{n['node']} ({n['op']}) on {n['place']}: {n['why']}" for n in fallback["nodes"]],
                        "precision_fallback.nodes")
    storage = report.get("storage_fallback")
    if storage and storage.get("weights"):
        line += (f"\nfp16 storage failed verification, so {len(storage['weights'])} weight(s) stay in fp32 "
                 f"({storage['runs']} verification run(s) to find them):")
        line += _listed([f"{w['weight']}: {w['why']}" for w in storage["weights"]], "storage_fallback.weights")
    return line


#: Entries of a fallback's list the closing lines show; the report lists every one.
LISTED = 20


def _listed(entries: list[str], where: str) -> str:
    """The first ``LISTED`` entries, one an indented line, and how many more the report's ``where`` holds."""
    shown = "".join(f"\n  {entry}" for entry in entries[:LISTED])
    more = len(entries) - LISTED
    return shown + (f"\n  ... and {more} more (the report's {where} lists every one)" if more > 0 else "")


def support_summary(support: dict[str, Any], width: int | None = None) -> str:
    """What --check-support found: one line, then (after kernel pick) per op type its places or why none."""
    places = ",".join(support["places"])
    unsupported = support.get("unsupported") or []
    if not unsupported:
        head = f"every one of the {support['op_types']} op types has a kernel in the valid places ({places})"
    else:
        head = (f"{len(unsupported)} of {support['op_types']} op types have no kernel in the valid places "
                f"({places}):")
    if "ops" not in support:  # checked before any rewrite (a pipeline without kernel pick)
        lines = [head]
        for entry in unsupported:
            nodes = entry["nodes"]
            lines.append(f"  {entry['op']}: {', '.join(nodes[:6])}" + (f" (+{len(nodes) - 6})" if len(nodes) > 6 else ""))
        return "\n".join(lines)
    from worker.engine.summary import render_table

    rows = [[row["op"], str(row["nodes"]),
             ", ".join(f"{place} x{count}" for place, count in row["places"].items()) or "none",
             row.get("note") or ""] for row in support["ops"]]
    text = head + "\n" + render_table("op types after the rewrites, as kernel pick placed them",
                                       ["op type", "nodes", "places", "why"], rows, width=width,
                                       keep_whole=("op type",))
    removed = support.get("removed_by_rewrites") or []
    if removed:
        text += (f"\nwithout a kernel in the input but removed by the rewrites: {', '.join(removed)}")
    return text


def run_targets(args: argparse.Namespace) -> int:
    from worker.engine.api import list_targets

    targets = list_targets(op=args.op, target=args.target)
    if args.json:
        print(json.dumps(targets, indent=2))
        return 0
    if args.op and not targets:
        print(f"no target has a kernel for {terminal_safe(args.op)} (ops outside the default domain are "
              f"qualified: mirserve.FusedConvRelu)")
        return 0
    if args.ops:
        print(terminal_safe(ops_matrix(targets)))
        return 0
    for target in targets:
        kernels = target["kernels"]
        print(f"{target['name']} (memory: {target['memory_space']}; {len(kernels)} kernels) {target['description']}")
        if target["source"]:
            print(f"  source: {target['source']}")
        by_op: dict[str, set[str]] = {}
        for kernel in kernels:
            by_op.setdefault(kernel["op"], set()).add(f"{kernel['precision']}/{kernel['layout']}")
        for op in sorted(by_op):
            print(f"  {op:32} {' '.join(sorted(by_op[op]))}")
    return 0


def ops_matrix(targets: list[dict[str, Any]], width: int | None = None) -> str:
    """Every op against every target, as Paddle-Lite's --print_all_ops: ``Y`` where the target has a kernel
    (``Y*`` when an NHWC form is among them), ``-`` where not; ``mirserve targets TARGET`` and ``--json``
    give every precision and layout."""
    from worker.engine.summary import render_table

    forms: dict[str, dict[str, set[str]]] = {}
    for target in targets:
        for kernel in target["kernels"]:
            forms.setdefault(kernel["op"], {}).setdefault(target["name"], set()).add(kernel["layout"])
    names = [t["name"] for t in targets]

    def cell(layouts: set[str] | None) -> str:
        return "-" if not layouts else "Y*" if "nhwc" in layouts else "Y"

    rows = [[op, *(cell(forms[op].get(name)) for name in names)] for op in sorted(forms)]
    return render_table(f"{len(rows)} ops x {len(names)} targets (Y: a kernel, Y*: an NHWC one too; "
                        f"`mirserve targets TARGET` lists precisions and layouts)", ["op", *names], rows,
                        width=width, keep_whole=names)


def run_passes(args: argparse.Namespace) -> int:
    from worker.engine.api import list_all

    everything = list_all()
    if args.json:
        print(json.dumps(everything, indent=2))
        return 0
    rows = [("POS", "NAME", "KIND", "LEVEL", "TARGETS", "PEER", "ORIGIN", "DESCRIPTION")]
    for p in sorted(everything["passes"], key=lambda p: (p["position"] is None, p["position"] or 0, p["name"])):
        rows.append((str(p["position"] or "-"), p["name"], p["kind"], str(p["level"]),
                     ",".join(p["targets"]) if p["targets"] else "any", p["peer"] or "-", p["origin"],
                     p["description"]))
    _print_table(rows)
    _print_plugin_tables(everything)
    return 0


def _print_plugin_tables(everything: dict[str, Any]) -> None:
    bands = ", ".join(f"{b['name']} {b['priorities'][0]}-{b['priorities'][1]} in {b['stage']}"
                      for b in everything["filter_bands"])
    print(f"\nFILTERS AND CALLBACKS (priority bands: {bands})")
    rows = [("PRIORITY", "NAME", "BINDS", "STAGE", "LEVEL", "ORIGIN", "DESCRIPTION")]
    for f in everything["filters"]:
        rows.append((str(f.get("priority", "-")), f["name"], f.get("binds") or f["kind"].replace("_", "-"),
                     f["stage"], str(f["level"]), f["origin"], f["description"]))
    _print_table(rows, empty="none")
    print("\nPIPELINES")
    _print_table([("NAME", "ORIGIN", "DESCRIPTION")] +
                 [(p["name"], p["origin"], p["description"]) for p in everything["pipelines"]])
    print("\nPLUGINS")
    rows = [("STATUS", "FOUND BY", "ORIGIN", "ERROR OR WHAT IT PROVIDES")]
    for p in everything["plugins"]:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in p["provides"].items())
        rows.append((p["status"], p["found_by"], p["origin"], p["error"] if p["error"] else provides))
    _print_table(rows, empty="none (MIRSERVE_PLUGIN_PATH, mirserve.plugins entry points, --plugin FILE)")


def _print_table(rows: list[tuple[str, ...]], empty: str = "") -> None:
    """Columns padded to their widest cell; the last column is left ragged. Only ``empty`` without rows."""
    if len(rows) == 1 and empty:
        print(empty)
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])


def main(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    if parser is None:
        parser, _ = build_parser()
    args = parser.parse_args(argv)
    try:
        load_plugins(args)
        return args.func(args)
    except MirserveError as exc:
        if args.debug or os.environ.get("MIRSERVE_DEBUG"):
            raise
        print(f"mirserve: error: {terminal_safe(str(exc), lines=False)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`mirserve ... | head`): nothing left to tell
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # e.g. the disk is full, or the report's directory is missing
        if args.debug or os.environ.get("MIRSERVE_DEBUG"):
            raise
        print(f"mirserve: error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
