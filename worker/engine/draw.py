"""The optimized graph as a picture: Graphviz DOT or SVG, nodes coloured by place, casts marked.

A node's colour is its place (the ``mirserve.place`` node metadata an optimized model carries; grey for a
node with none, e.g. in a model that was never placed); a legend lists each place with its node count. Casts
(``mirserve.io_copy``, ``calib``, ``layout``) are drawn as arrow-shaped nodes with a border of their kind's
colour and say from which place to which. Hovering a node shows its name, kernel and place; hovering an
edge, the value's name, type and shape. Only the top-level graph is drawn; a node holding bodies (If, Loop,
Scan) says how many.

DOT text needs nothing installed; SVG (and PNG, PDF) needs Graphviz's ``dot`` program. Without it the error
says so and how to get it, and DOT is still available.

``python -m worker.engine.draw MODEL -o OUT.svg [--memory-limit-mb N] [--max-nodes N]`` is how the service
draws a job's model: in a child process with an address-space limit, since the model came from an upload.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

from worker.engine.errors import MirserveError, OptionsError
from worker.engine.summary import CAST_OPS

PLACE_KEY, KERNEL_KEY = "mirserve.place", "mirserve.kernel"  # the node metadata every optimized model carries
#: Fill colours given to places in order of how many nodes they hold (ColorBrewer Set3, light enough for text).
PALETTE = ("#8dd3c7", "#fdb462", "#bebada", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3", "#bc80bd", "#ccebc5",
           "#fb8072", "#ffed6f", "#d9d9d9")
UNPLACED = "#eeeeee"
CAST_BORDERS = {"io_copy": "#d62728", "calib": "#ff7f0e", "layout": "#9467bd"}
FORMATS = ("dot", "svg", "png", "pdf")
DEFAULT_MAX_NODES = 5000
GRAPHVIZ_HINT = ("install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz), "
                 "or write DOT instead (-o graph.dot)")


class GraphvizMissing(MirserveError):
    """Graphviz's ``dot`` program is not installed, so no SVG/PNG/PDF can be laid out."""


def graph_dot(model, title: str | None = None, max_nodes: int = DEFAULT_MAX_NODES) -> str:
    """The model's top-level graph as DOT text."""
    import graphviz

    graph = model.graph
    if len(graph) > max_nodes:
        raise OptionsError(f"the graph has {len(graph):,} nodes, more than the {max_nodes:,} a picture is drawn "
                           f"for; raise --max-nodes (Graphviz may then take minutes)", field="max_nodes")
    places = Counter(node.metadata.get(PLACE_KEY) for node in graph if node.metadata.get(PLACE_KEY))
    colours = {place: PALETTE[i % len(PALETTE)] for i, (place, _) in enumerate(places.most_common())}
    dot = graphviz.Digraph("model", graph_attr={"rankdir": "TB", "fontname": "Helvetica", "fontsize": "12",
                                                "label": title or "", "labelloc": "t"},
                           node_attr={"fontname": "Helvetica", "fontsize": "10", "style": "filled",
                                      "shape": "box", "height": "0.3"},
                           edge_attr={"arrowsize": "0.6", "color": "#555555"})
    ids = {}
    for index, value in enumerate(graph.inputs):
        ids[value.name] = f"input{index}"
        dot.node(f"input{index}", value.name, shape="oval", fillcolor="#ffffff", tooltip=_value_text(value))
    for index, node in enumerate(graph):
        ident = f"n{index}"
        dot.node(ident, **_node_attributes(node, colours))
        for value in node.inputs:
            if value is None or value.is_initializer:
                continue
            source = ids.get(value.name)
            if source is not None:
                dot.edge(source, ident, tooltip=_value_text(value))
        for value in node.outputs:
            ids[value.name] = ident
    for index, value in enumerate(graph.outputs):
        dot.node(f"output{index}", value.name, shape="oval", fillcolor="#ffffff", tooltip=_value_text(value))
        if value.name in ids:
            dot.edge(ids[value.name], f"output{index}", tooltip=_value_text(value))
    _legend(dot, places, colours)
    return dot.source


def _node_attributes(node, colours: dict[str, str]) -> dict[str, str]:
    op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
    place = node.metadata.get(PLACE_KEY)
    kernel = node.metadata.get(KERNEL_KEY)
    tooltip = f"{node.name or '(unnamed)'}\n{op}" + (f"\nkernel {kernel}" if kernel else "") + \
        (f"\nplace {place}" if place else "")
    bodies = len(node.subgraphs())
    label = node.op_type + (f"\n({bodies} bodies)" if bodies > 1 else "\n(1 body)" if bodies else "")
    attributes = {"label": label, "fillcolor": colours.get(place, UNPLACED), "tooltip": tooltip}
    kind = CAST_OPS.get(op)
    if kind is not None:
        source = node.inputs[0] if node.inputs else None
        origin = source.producer.metadata.get(PLACE_KEY) if source is not None and source.producer else None
        attributes.update(label=f"{kind}\n{origin or 'input'} -> {place or '?'}", shape="cds",
                          color=CAST_BORDERS[kind], penwidth="2.5")
    return attributes


def _value_text(value) -> str:
    from onnx import helper

    dtype = helper.tensor_dtype_to_np_dtype(value.dtype).name if value.dtype else "unknown type"
    shape = "unknown shape" if value.shape is None else "[" + ", ".join(str(d) for d in value.shape) + "]"
    return f"{value.name}: {dtype} {shape}"


def _legend(dot, places: Counter, colours: dict[str, str]) -> None:
    if not places:
        return
    with dot.subgraph(name="cluster_legend", graph_attr={"label": "places", "style": "rounded",
                                                         "color": "#999999"}) as legend:
        for index, (place, count) in enumerate(places.most_common()):
            legend.node(f"legend{index}", f"{place}: {count} node(s)", fillcolor=colours[place])
        for index, (kind, colour) in enumerate(CAST_BORDERS.items()):
            legend.node(f"legend_cast{index}", kind, shape="cds", fillcolor="#ffffff", color=colour,
                        penwidth="2.5")


def render(dot_text: str, fmt: str) -> bytes:
    """Lay the DOT text out with Graphviz into ``fmt`` (svg, png, pdf)."""
    import graphviz

    try:
        return graphviz.Source(dot_text).pipe(format=fmt, engine="dot", quiet=True)
    except graphviz.ExecutableNotFound:
        raise GraphvizMissing(f"drawing {fmt.upper()} needs Graphviz's 'dot' program, which is not installed: "
                              f"{GRAPHVIZ_HINT}") from None
    except graphviz.CalledProcessError as error:
        detail = (error.stderr or b"").decode(errors="replace").strip().splitlines()
        raise MirserveError(f"Graphviz failed to lay the graph out: {detail[-1] if detail else error}") from None


def format_of(path: Path, fmt: str | None = None) -> str:
    chosen = (fmt or path.suffix.lstrip(".")).lower()
    if chosen not in FORMATS:
        raise OptionsError(f"{path}: cannot tell the picture's format from the name; use a .dot, .svg, .png or "
                           f".pdf name, or --format", field="output")
    return chosen


def draw(model_path: str | os.PathLike, output_path: str | os.PathLike, fmt: str | None = None,
         max_nodes: int = DEFAULT_MAX_NODES, title: str | None = None) -> Path:
    """Draw the model at ``model_path`` into ``output_path`` (the format from its suffix unless given)."""
    from worker.engine.atomic import atomic_path
    from worker.engine.ir import load_model

    output_path = Path(output_path)
    chosen = format_of(output_path, fmt)
    model = load_model(model_path)  # the structure only: weights stay in the mapped file, never decoded
    text = graph_dot(model, title=title or Path(model_path).name, max_nodes=max_nodes)
    data = text.encode() if chosen == "dot" else render(text, chosen)
    with atomic_path(output_path) as tmp:
        Path(tmp).write_bytes(data)
    return output_path


def main(argv: Sequence[str] | None = None) -> int:
    """The service's child: limits itself first, then draws; errors are one line on stderr and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m worker.engine.draw")
    parser.add_argument("model")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--format", choices=FORMATS)
    parser.add_argument("--title")
    parser.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES)
    parser.add_argument("--memory-limit-mb", type=int, default=0)
    args = parser.parse_args(argv)
    if args.memory_limit_mb > 0:
        import resource

        limit = args.memory_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        draw(args.model, args.output, args.format, args.max_nodes, args.title)
    except MirserveError as error:
        print(str(error), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
