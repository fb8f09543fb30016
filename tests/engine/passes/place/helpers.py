"""Run the place pipeline in-process and check what the issue promises about its result."""
from __future__ import annotations

from pathlib import Path

from worker.engine.ir import Graph, Model, load_model
from worker.engine.ir.verify import VerifyInstrument
from worker.engine.kernels import default_table
from worker.engine.kernels.pick import Pick
from worker.engine.options import OptimizeOptions
from worker.engine.passes import PassContext, PassManager, get_pipeline
from worker.engine.inference import apply_input_shapes
from worker.engine.passes.support.casts import cast_kind, same_memory
from worker.engine.passes.support.placement import KERNEL_KEY, PLACE_KEY, fetch_place, is_constant
from worker.engine.places import Layout, Precision, get_target, parse_places


def place_model(source, places: str, *, shapes=None, verify_ir: bool = True, **options) -> PassContext:
    """Load (a path or a Model) and run the default pipeline for ``places``; returns the context."""
    model = load_model(Path(source)) if not isinstance(source, Model) else source
    opts = OptimizeOptions(places=places, input_shapes=shapes or {}, **options)
    apply_input_shapes(model.graph, opts.input_shapes)
    ctx = PassContext(model, opts, parse_places(places, host_fallback=opts.host_fallback),
                      kernels=default_table())
    manager = PassManager(instruments=[VerifyInstrument()] if verify_ir else [])
    ctx.report["trace"] = manager.run(ctx, get_pipeline(opts.pipeline).steps_for(opts))
    return ctx


def trace_entry(ctx: PassContext, name: str) -> dict:
    return next(t for t in ctx.report["trace"] if t["pass"] == name)


def casts(graph: Graph) -> list:
    return [n for n in graph if cast_kind(n) is not None]


def check_annotations(graph: Graph) -> None:
    """Every node names an entry of its target's table and a place on that target."""
    table = default_table()
    for node in graph.all_nodes():
        kernel_id, place = node.metadata.get(KERNEL_KEY), node.metadata.get(PLACE_KEY)
        assert kernel_id and place, f"{node!r} has no kernel annotation"
        kernel = table.get(kernel_id)
        assert kernel is not None, f"{node!r}: {kernel_id} is not an entry of any table"
        assert place.split("/")[0] == kernel.target, f"{node!r}: place {place} is not on {kernel.target}"
        assert isinstance(node.pick, Pick) and node.pick.kernel is kernel, f"{node!r}: no pick of {kernel_id}"
        assert str(node.place) == place, f"{node!r}: placed on {node.place}, annotated {place}"


def check_shared_casts(graph: Graph) -> None:
    """No source value has two casts to the same type."""
    for value in graph.values():
        seen = set()
        for node in {u.node for u in value.uses}:
            kind = cast_kind(node)
            if kind is None:
                continue
            key = (kind, str(node.output().place))
            assert key not in seen, f"{value.name} has two {kind} casts to {key[1]}"
            seen.add(key)


def _chain(value):
    """Walk back from a consumer's input through casts: (source value, cast kinds on the way)."""
    kinds = []
    while value.producer is not None and cast_kind(value.producer) is not None:
        kinds.append(cast_kind(value.producer))
        value = value.producer.input(0)
    return value, kinds


def _needed(source, precision, layout, target, rank) -> list[str]:
    place = source.place
    needed = []
    if target is not None and not same_memory(place.target.name, target):
        needed.append("io_copy")
    if Precision.ANY not in (precision, place.precision) and precision is not place.precision:
        needed.append("calib")
    if rank == 4 and Layout.ANY not in (layout, place.layout) and layout is not place.layout:
        needed.append("layout")
    return needed


def check_edges(ctx: PassContext, fp16_storage: bool = False) -> int:
    """Every edge between two places crosses a cast chain converting exactly the differing parts.

    Returns the number of edges that needed a conversion. Weights are converted offline instead: an edge
    from a constant needs no cast, and the constant must already have the declared precision and layout
    (with fp16 storage, one calib from the fp16 weight to a consumer that computes in fp32).
    """
    graph, converted = ctx.graph, 0
    for node in graph:
        pick = node.pick
        if cast_kind(node) is not None or pick is None:
            continue
        for slot, value in enumerate(node.inputs):
            if value is None:
                continue
            port = pick.input(slot)
            precision, layout, target = port.precision, port.layout, port.target
            source, kinds = _chain(value)
            if is_constant(source):
                stored_half = fp16_storage and kinds == ["calib"] and source.dtype == 10
                assert not kinds or stored_half, f"{node.name} reads constant {source.name} through {kinds}"
                target = None  # weights are loaded where their consumer runs
            needed = _needed(source, precision, layout, target, source.rank)
            assert sorted(kinds) == sorted(needed) or (needed == ["io_copy"] and set(kinds) == {"io_copy"}), \
                f"{node.name} input {slot} ({source.name}, {source.place}) -> {precision}/{layout}/{target}: " \
                f"casts {kinds}, needed {needed}"
            converted += bool(needed)
    for value in graph.outputs:
        fetch = fetch_place(ctx, value)
        source, kinds = _chain(value)
        needed = _needed(source, fetch.precision, fetch.layout, fetch.target.name, source.rank)
        assert sorted(kinds) == sorted(needed) or (needed == ["io_copy"] and set(kinds) == {"io_copy"}), \
            f"graph output {value.name}: casts {kinds}, needed {needed}"
        assert value.place.target.shares_memory_with(get_target("host"))
        assert value.place.precision is fetch.precision and value.place.layout in (fetch.layout, Layout.ANY)
    return converted
