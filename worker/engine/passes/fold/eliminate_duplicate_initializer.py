"""eliminate_duplicate_initializer: initializers with the same type, shape and bytes become one.

    W1 = t, W2 = t (bit for bit)    becomes    W1 = t, readers of W2 read W1

Candidates are grouped by element type and shape, then by a sample of at most 64 evenly spaced elements,
and only arrays whose samples agree are compared in full (block by block, bitwise, so -0.0 and 0.0 differ and
a NaN equals itself). A broadcast view (a folded ConstantOfShape) compares by its single value without
reading anything. Graph inputs and graph outputs are left alone; each graph is merged on its own. Exact.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from worker.engine.ir import Graph, Value
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.arrays import arrays_equal, is_uniform
from worker.engine.passes.registry import register_pass

SAMPLE = 64


def value_key(value: Value) -> bytes:
    """``sample_key`` of an initializer, read from its file without mapping it when it is mapped data."""
    source = value.const_source
    if source is not None and source.shape and 0 not in source.shape:  # the data as loaded
        size = int(np.prod(source.shape, dtype=np.int64))
        positions = np.linspace(0, size - 1, num=min(size, SAMPLE)).astype(np.int64)
        return np.asarray(value.take(positions)).tobytes()
    return sample_key(value.const)


def sample_key(array: np.ndarray) -> bytes:
    """A cheap fingerprint: a few evenly spaced elements, read without copying the array."""
    count = min(array.size, SAMPLE)
    if count == 0:
        return b""
    if is_uniform(array):  # a broadcast view: its one value, as often as a sample of a real array has it
        picked = np.repeat(np.asarray(array[(0,) * array.ndim]).reshape(1), count)
    else:
        positions = np.linspace(0, array.size - 1, num=count).astype(np.int64)
        picked = array.reshape(-1)[positions] if array.flags.c_contiguous else np.asarray(array.flat[positions])
    return picked.tobytes()


def merge_graph(graph: Graph) -> list[tuple[str, str]]:
    """Merge the duplicates of one graph; returns (removed, kept) name pairs."""
    groups: dict[tuple, list[Value]] = defaultdict(list)
    for value in graph.initializers.values():
        if value.is_constant and not value.is_graph_output and value.is_used:
            groups[(value.dtype, value.shape)].append(value)
    merged: list[tuple[str, str]] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        by_sample: dict[bytes, list[Value]] = defaultdict(list)
        for value in members:
            by_sample[value_key(value)].append(value)
        for candidates in by_sample.values():
            merged.extend(_merge_equal(graph, candidates))
    return merged


def _merge_equal(graph: Graph, candidates: list[Value]) -> list[tuple[str, str]]:
    kept: list[Value] = []
    merged = []
    for value in candidates:
        twin = next((k for k in kept if arrays_equal(k.const, value.const)), None)
        if twin is None:
            kept.append(value)
            continue
        graph.replace_all_uses(value, twin)
        merged.append((value.name, twin.name))
        graph.remove_initializer(value)
    return merged


@register_pass(name="eliminate_duplicate_initializer", peer="onnxoptimizer", kind=PassKind.PROGRAM, level=1,
               description="merge initializers with the same type, shape and bytes")
def eliminate_duplicate_initializer(ctx: PassContext) -> PassResult:
    result = PassResult()
    for graph in ctx.graph.all_graphs():
        pairs = merge_graph(graph)
        if pairs:
            result.rewrote(count=len(pairs))
            result.data.setdefault("merged", {}).update(dict(pairs))
    return result
