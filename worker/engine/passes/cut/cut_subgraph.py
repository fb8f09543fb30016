"""cut_subgraph: keep only what lies between the named values (ncnnoptimize's cutstart/cutend).

    x -> A -> s -> B -> C -> e -> D -> y     cut_start=s, cut_end=e     s -> B -> C -> e

The start values become graph inputs (with the dtype and shape type inference gave them), the end values the
graph outputs, and every node that no longer contributes to an output is removed. A node between the two
that also reads some other graph input keeps that input. With no start, the model's inputs bound the cut;
with no end, the model's outputs that depend on a start do. The run optimizes (and verifies against) the cut
model: ``optimize()`` runs this pass first, after type inference, when either option is set.

Refusals are user errors that name the value: a name that is no value of the graph, a weight as a start, a
start whose type is unknown, an end that does not depend on any start, a value both start and end.
"""
from __future__ import annotations

from worker.engine.errors import OptionsError
from worker.engine.ir import Graph, Value
from worker.engine.passes.base import Analysis, PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass


def _resolve(graph: Graph, names, field: str) -> list[Value]:
    found, missing = [], []
    for name in names:
        value = graph.value(name)
        (found if value is not None else missing).append(value if value is not None else name)
    if missing:
        listed = ", ".join(repr(n) for n in missing)
        raise OptionsError(f"{field} names {listed}, which {'is no value' if len(missing) == 1 else 'are no values'} "
                           f"of the model's graph (a node output, or a graph input)", field=field)
    return found


def _reachable(graph: Graph, starts: list[Value]) -> set[Value]:
    """Values of ``graph`` that depend on a start (the starts included), through nested bodies too."""
    seen, pending = set(starts), list(starts)
    while pending:
        value = pending.pop()
        for use in value.uses:
            node = graph.ancestor_in(use.node)  # a use inside a body makes its holder depend on the value
            for output in node.outputs if node is not None else ():
                if output not in seen:
                    seen.add(output)
                    pending.append(output)
    return seen


def _check_starts(starts: list[Value]) -> None:
    for value in starts:
        if value.is_initializer:
            raise OptionsError(f"cut_start names {value.name!r}, a weight of the model; a cut starts at a value "
                               f"a node computes, or at a graph input", field="cut_start")
        if not value.dtype:
            raise OptionsError(f"cannot start the cut at {value.name!r}: its element type is unknown (type "
                               f"inference could not derive it; --input-shape may help)", field="cut_start")


def _as_input(graph: Graph, value: Value) -> Value:
    """A new graph input that takes over ``value``'s name and every reader of it."""
    name = value.name
    graph.rename_fresh(value, f"{name}_before_cut")
    entry = graph.add_input(Value(name, value.dtype, value.shape))
    graph.replace_all_uses(value, entry)
    return entry


@register_pass(name="cut_subgraph", peer="ncnn", kind=PassKind.PROGRAM, level=0,
               invalidates={Analysis.TYPES, Analysis.ORDER},
               description="keep only what lies between the values of the cut_start and cut_end options")
def cut_subgraph(ctx: PassContext) -> PassResult:
    result = PassResult()
    options, graph = ctx.options, ctx.graph
    if not options.cut_start and not options.cut_end:
        return result
    starts = _resolve(graph, options.cut_start, "cut_start")
    ends = _resolve(graph, options.cut_end, "cut_end")
    _check_starts(starts)
    both = sorted({v.name for v in starts} & {v.name for v in ends})
    if both:
        raise OptionsError(f"{both[0]!r} is both a start and an end of the cut; nothing lies between",
                           field="cut_end")
    reached = _reachable(graph, starts or list(graph.inputs))
    unreached = [v.name for v in ends if v not in reached]
    if unreached:
        raise OptionsError(f"cut_end {', '.join(repr(n) for n in unreached)} cannot be reached from the cut start "
                           f"({', '.join(v.name for v in starts) or 'the model inputs'}): it does not depend on "
                           f"{'it' if len(starts) == 1 else 'any of them'}", field="cut_end")
    if not ends:
        ends = [v for v in graph.outputs if v in reached]
        if not ends:
            raise OptionsError(f"no output of the model depends on the cut start "
                               f"({', '.join(v.name for v in starts)}): there is nothing to keep", field="cut_start")
    nodes_before, inputs_before = len(graph), [v.name for v in graph.inputs]
    new_inputs = {v.name: (_as_input(graph, v) if not v.is_graph_input else v) for v in starts}
    graph.set_outputs([graph.value(v.name) for v in ends])
    removed = graph.remove_unused(reversed(list(graph)))
    for value in list(graph.inputs):
        if value.name not in new_inputs and not value.uses and not value.is_graph_output:
            graph.remove_input(value)
    # The starts come first, in the order given; inputs the kept nodes still read follow.
    graph.inputs.sort(key=lambda v: (v.name not in new_inputs, list(new_inputs).index(v.name)
                                     if v.name in new_inputs else 0))
    result.rewrote({"rule": "cut_subgraph", "from": removed, "to": []}, count=max(len(removed), 1))
    result.data.update(inputs=[v.name for v in graph.inputs], outputs=[v.name for v in graph.outputs],
                       inputs_before=inputs_before, nodes_removed=nodes_before - len(graph))
    ctx.report["cut"] = {"start": list(options.cut_start), "end": list(options.cut_end),
                         "inputs": result.data["inputs"], "outputs": result.data["outputs"],
                         "nodes_before": nodes_before, "nodes": len(graph)}
    return result
