"""Model-local functions: what their calls expand to, and calls replaced by bodies.

A model may define functions (``ModelProto.functions``) and call them as ops of its own domains; a body may
call other functions. A few hundred bytes can so stand for 2^40 nodes (each function calling the one before
it twice), which onnx's shape inference would expand for as long as it takes. ``expanded_nodes`` counts what
the graph stands for without expanding anything, and refuses a function that calls itself.

``inline_calls`` replaces the calls of chosen functions by their bodies (onnx's inliner: fresh names,
attribute references resolved, nested bodies, calls inside bodies), as onnxruntime does for the functions no
execution provider takes: the loader chooses the functions no valid place has a kernel for. A function that
imports another version of an opset than the model is inlined when each of its ops of that opset means the
same at both versions, or its body converted by onnx's version converter; otherwise it is refused, saying why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Iterator

import onnx
import onnx.inliner
from onnx import AttributeProto, helper, version_converter

from worker.engine.errors import ModelError
from worker.engine.limits import printable

FunctionKey = tuple[str, str, str]  # (domain, name, overload)


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _key(domain: str, name: str, overload: str = "") -> FunctionKey:
    return _domain(domain), name, overload


def _nodes(nodes) -> Iterator[onnx.NodeProto]:
    """``nodes`` and every node of the bodies nested in their attributes."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                stack.extend(attr.g.node)
            elif attr.type == AttributeProto.GRAPHS:
                for graph in attr.graphs:
                    stack.extend(graph.node)


def _callee(node: onnx.NodeProto, functions: dict[FunctionKey, onnx.FunctionProto]) -> FunctionKey | None:
    key = _key(node.domain, node.op_type, node.overload)
    return key if key in functions else None


def qualified(key: FunctionKey) -> str:
    """``domain.name`` (``:overload`` when it has one), as the report names a function."""
    domain, name, overload = key
    return f"{domain}.{name}" + (f":{overload}" if overload else "")


def _name(key: FunctionKey) -> str:
    return printable(qualified(key))


def check_calls(model: onnx.ModelProto, path: Path) -> None:
    """Each function is defined once, and each call passes no more inputs and outputs than it declares."""
    functions: dict[FunctionKey, onnx.FunctionProto] = {}
    for function in model.functions:
        key = _key(function.domain, function.name, function.overload)
        if key in functions:
            raise ModelError(f"{path}: function {_name(key)} is defined twice")
        functions[key] = function
    for nodes in (model.graph.node, *(f.node for f in model.functions)):
        for node in _nodes(nodes):
            callee = _callee(node, functions)
            if callee is None:
                continue
            for what, given, declared in (("inputs", node.input, functions[callee].input),
                                          ("outputs", node.output, functions[callee].output)):
                if len(given) > len(declared):
                    raise ModelError(f"{path}: node {printable(node.name)} calls function {_name(callee)} with "
                                     f"{len(given)} {what}; it declares {len(declared)}")


def expanded_nodes(model: onnx.ModelProto, path: Path) -> int:
    """Nodes of the main graph and its bodies with every call of a model-local function counted as the nodes
    its body expands to; raises ModelError when a function reaches a call of itself."""
    functions = {_key(f.domain, f.name, f.overload): f for f in model.functions}
    if not functions:
        return sum(1 for _ in _nodes(model.graph.node))
    sizes: dict[FunctionKey, int] = {}
    for root in functions:
        # depth-first over the call graph without recursion (a chain of calls may be as long as the file allows)
        path_keys: list[FunctionKey] = []
        stack: list[tuple[FunctionKey, bool]] = [(root, False)]
        while stack:
            key, done = stack.pop()
            if done:
                path_keys.pop()
                sizes[key] = sum(sizes[callee] if (callee := _callee(n, functions)) else 1
                                 for n in _nodes(functions[key].node))
                continue
            if key in sizes:
                continue
            if key in path_keys:
                cycle = path_keys[path_keys.index(key):] + [key]
                raise ModelError(f"{path}: function {_name(key)} calls itself"
                                 + (f" (through {' -> '.join(_name(k) for k in cycle)})" if len(cycle) > 2 else "")
                                 + ", so its calls never end")
            path_keys.append(key)
            stack.append((key, True))
            stack.extend((callee, False) for n in _nodes(functions[key].node)
                         if (callee := _callee(n, functions)) and callee not in sizes)
    return sum(sizes[callee] if (callee := _callee(n, functions)) else 1 for n in _nodes(model.graph.node))


def _changed_op(function: onnx.FunctionProto, domain: str, theirs: int, ours: int) -> str | None:
    """None when every op of ``domain`` in the function's body has the same definition at opset versions
    ``theirs`` (the function's) and ``ours`` (the model's); otherwise the first op that differs."""
    for node in _nodes(function.node):
        if _domain(node.domain) != domain:
            continue
        try:
            if (onnx.defs.get_schema(node.op_type, theirs, domain).since_version
                    != onnx.defs.get_schema(node.op_type, ours, domain).since_version):
                return node.op_type
        except onnx.defs.SchemaError:
            return node.op_type
    return None


def _has_references(function: onnx.FunctionProto) -> bool:
    return any(attr.ref_attr_name for node in _nodes(function.node) for attr in node.attribute)


def _convert_body(function: onnx.FunctionProto, theirs: int, ours: int, path: Path) -> None:
    """The function's body rewritten from default-domain opset ``theirs`` to ``ours`` by onnx's version
    converter (a body without attribute references: the converter rebuilds each node from its values)."""
    untyped = [helper.make_value_info(name, onnx.TypeProto()) for name in function.input]
    graph = helper.make_graph(list(function.node), "body", untyped,
                              [helper.make_value_info(name, onnx.TypeProto()) for name in function.output])
    imports = [helper.make_opsetid(e.domain, theirs if _domain(e.domain) == "" else e.version)
               for e in function.opset_import]
    body = helper.make_model(graph, opset_imports=imports)
    try:
        converted = version_converter.convert_version(body, ours)
    except Exception as exc:  # the converter raises bare RuntimeErrors and C++ errors with the op named
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: function {_name(_key(function.domain, function.name, function.overload))} "
                         f"imports opset {theirs} of the default domain and the model opset {ours}, and onnx's "
                         f"version converter cannot convert its body: {message}") from None
    del function.node[:]
    function.node.extend(converted.graph.node)


def _align_opsets(model: onnx.ModelProto, chosen: set[FunctionKey], path: Path) -> None:
    """Give each chosen function the model's opset versions, and the model the opsets its bodies import and it
    does not. A body of another default-domain opset is converted where it has no attribute references, and
    otherwise taken as it is where each of its ops means the same at both versions; else it is refused."""
    imports = {_domain(e.domain): e for e in model.opset_import}
    for function in model.functions:
        key = _key(function.domain, function.name, function.overload)
        if key not in chosen:
            continue
        for entry in function.opset_import:
            domain = _domain(entry.domain)
            ours = imports.get(domain)
            if ours is None:
                imports[domain] = model.opset_import.add(domain=entry.domain, version=entry.version)
                continue
            if ours.version == entry.version:
                continue
            if domain == "" and not _has_references(function):
                _convert_body(function, entry.version, ours.version, path)
            elif (changed := _changed_op(function, domain, entry.version, ours.version)) is not None:
                raise ModelError(
                    f"{path}: function {_name(key)} imports opset {entry.version} of {domain or 'the default domain'} "
                    f"and the model opset {ours.version}, and {printable(changed)} is not the same op in both, so "
                    f"its calls cannot be replaced by its body")
            entry.version = ours.version


def _fill_defaults(model: onnx.ModelProto) -> None:
    """Every call of a function with attribute defaults (``attribute_proto``) given the ones it leaves out.

    onnx's inliner resolves a reference to an attribute the call leaves out as absent, so the op of the body
    takes its own default (LeakyRelu's 0.01) instead of the function's; onnxruntime takes the function's."""
    functions = {_key(f.domain, f.name, f.overload): f for f in model.functions}
    bodies = [model.graph.node, *(f.node for f in model.functions)]
    for nodes in bodies:
        for node in _nodes(nodes):
            callee = _callee(node, functions)
            if callee is None:
                continue
            given = {attr.name for attr in node.attribute}
            for default in functions[callee].attribute_proto:
                if default.name not in given:
                    node.attribute.append(default)


def _inline_selected(model: onnx.ModelProto, chosen: Iterable[tuple[str, str]]) -> onnx.ModelProto:
    """onnx's inliner on ``model`` for the functions ``chosen`` ((domain, name) pairs), with the functions'
    attribute defaults given at every call first. ``model`` gets the defaults; raises what the inliner
    raises."""
    _fill_defaults(model)
    return onnx.inliner.inline_selected_functions(model, sorted(set(chosen)))


def calls(model: onnx.ModelProto) -> dict[FunctionKey, int]:
    """Calls of each model-local function in the main graph and its bodies (not inside other functions)."""
    functions = {_key(f.domain, f.name, f.overload): f for f in model.functions}
    counts: dict[FunctionKey, int] = {}
    for node in _nodes(model.graph.node):
        if (callee := _callee(node, functions)) is not None:
            counts[callee] = counts.get(callee, 0) + 1
    return counts


def inline_calls(model: onnx.ModelProto, inline: Callable[[str, str], bool],
                 path: Path) -> tuple[onnx.ModelProto, dict[FunctionKey, int]]:
    """The model with the calls of the functions ``inline(domain, name)`` chooses replaced by their bodies,
    and how many calls of each were (counted in the main graph). The initializers are kept as they are, in
    their order. A chosen function that a kept function still calls stays in the model."""
    chosen = {key for key in (_key(f.domain, f.name, f.overload) for f in model.functions) if inline(key[0], key[1])}
    called = {key: count for key, count in calls(model).items() if key in chosen}
    if not called:
        return model, {}
    _align_opsets(model, chosen, path)
    names = [init.name for init in model.graph.initializer]
    try:
        result = _inline_selected(model, ((d, n) for d, n, _ in chosen))
    except Exception as exc:  # the inliner raises bare RuntimeErrors
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: onnx's inliner cannot replace the calls of model-local functions by their "
                         f"bodies: {message}") from None
    if [init.name for init in result.graph.initializer] != names:
        raise ModelError(f"{path}: onnx's inliner changed the model's initializers while replacing function calls")
    kept = {_key(f.domain, f.name, f.overload) for f in result.functions}
    still_called = {callee for f in result.functions for n in _nodes(f.node)
                    if (callee := _key(n.domain, n.op_type, n.overload)) in chosen and callee not in kept}
    for function in model.functions:
        if _key(function.domain, function.name, function.overload) in still_called:
            result.functions.append(function)
    return result, dict(sorted(called.items()))
