"""Each value's error against the reference, in bounded memory (the child's side of ``numeric.value_errors``).

Auto mixed precision ranks the nodes computing in fp16 by the error each adds, which takes every value of
both models: the reference (the input model) and the candidate run on the same inputs, and each value the
two share is compared. onnxruntime keeps every output of a session until the run returns, and asking a
session for fewer of its outputs does not help (they are all kept to the end), so a run with every value as
an output holds all of the model's activations at once: 11 GB for torchvision's MViT-v2 on a 16-frame clip,
where verification has 4 GiB.

So the values go in chunks, each a run of both models cut down to what computes that chunk's values and was
not run for an earlier chunk: a chunk's session takes the values earlier chunks computed that it reads as
inputs (each model its own), so every node runs once, not once per chunk after it (Mask R-CNN under fp16:
8 chunks, 16 runs of most of the model, 80 s; now each node once).
A chunk holds as many values as the budget allows, by the sizes the candidate declares (the engine writes
every value's shape); a value of unknown size counts as the largest known. Where the model's values do not fit
in one chunk, values that only move data (Reshape, Transpose, Concat, ... in the candidate) are not run for:
they carry the largest error and range of what they read, as the ranking needs. A chunk that still runs out of
memory is split in two and run again, down to single values; without a budget (``memory_mb`` 0) everything is
one chunk, as before.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

#: Elements compared at a time.
BLOCK = 1 << 20
#: One chunk's values (both models' copies) may take this fraction (1 / CHUNK_SHARE) of the child's memory.
CHUNK_SHARE = 3
#: Ops whose outputs only rearrange, select or repeat their inputs' elements: no arithmetic, no error of their
#: own, no value out of their inputs' range.
DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Concat",
                           "Split", "Expand", "Tile", "Gather", "GatherElements", "GatherND", "DepthToSpace",
                           "SpaceToDepth"})


def traced_errors(reference, candidate, shapes: Mapping[str, Any], feeds: Mapping[str, Any], *, rtol: float,
                  atol: float, memory_mb: int, fp16_max: float, not_finite: float,
                  is_allocation_failure) -> dict:
    """``{"errors": {value: error}, "beyond_fp16": [values], "chunks": n}`` for two ModelProtos (each with its
    fp16 values stored in fp16, as verification runs them) on ``feeds``."""
    names = _shared_values(reference, candidate)
    sizes = _value_bytes(candidate, shapes)
    budget = (memory_mb << 20) // CHUNK_SHARE if memory_mb > 0 else 0
    inferred: list[str] = []
    if budget and sum(sizes.get(n, 0) for n in names) > budget:
        movers = _moved_values(candidate)
        inferred = [n for n in names if n in movers]
        names = [n for n in names if n not in movers]
    errors: dict[str, float] = {}
    beyond: set[str] = set()
    queue = _chunks(names, sizes, budget)
    models = _Segments(reference, feeds, names), _Segments(candidate, feeds, names)
    runs = 0
    while queue:
        chunk = queue.pop(0)
        try:
            expected = _run(models[0], chunk)
            actual = _run(models[1], chunk)
        except Exception as exc:  # noqa: BLE001 - only running out of memory is retried
            if len(chunk) == 1 or not is_allocation_failure(exc):
                raise
            half = len(chunk) // 2
            queue[:0] = [chunk[:half], chunk[half:]]
            continue
        runs += 1
        for name in chunk:
            a, b = expected.pop(name, None), actual.pop(name, None)
            if _is_beyond(a, fp16_max):
                beyond.add(name)
            error = _error(a, b, rtol, atol, not_finite)
            if error is not None:
                errors[name] = error
    _infer(candidate, inferred, errors, beyond)
    return {"errors": errors, "beyond_fp16": sorted(beyond), "chunks": runs}


def _shared_values(reference, candidate) -> list[str]:
    """The values both models compute, in the candidate's order."""
    computed = {name for node in reference.graph.node for name in node.output if name}
    return list(dict.fromkeys(name for node in candidate.graph.node for name in node.output
                              if name and name in computed))


def _value_bytes(model, shapes: Mapping[str, Any]) -> dict[str, int]:
    """Each value's bytes in both models (its elements at 4 bytes in the reference, and at its own size in the
    candidate) by the candidate's declared shapes, its open dims named as in its inputs taken from
    ``shapes``; a value of unknown size: the largest known."""
    import numpy as np
    from onnx import helper

    dims: dict[str, int] = {}
    for value in model.graph.input:
        given = shapes.get(value.name)
        if given is None or not value.type.HasField("tensor_type"):
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, given):
            if dim.dim_param:
                dims[dim.dim_param] = int(size)
    sizes: dict[str, int] = {}
    unknown = []
    for value in (*model.graph.value_info, *model.graph.output):
        tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
        if tensor is None or not tensor.HasField("shape") or not tensor.elem_type:
            unknown.append(value.name)
            continue
        count = 1
        for dim in tensor.shape.dim:
            size = dim.dim_value if dim.HasField("dim_value") else dims.get(dim.dim_param)
            if size is None:
                count = None
                break
            count *= max(size, 0)
        if count is None:
            unknown.append(value.name)
            continue
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
        sizes[value.name] = count * (4 + itemsize)
    largest = max(sizes.values(), default=0)
    sizes.update((name, largest) for name in unknown)
    return sizes


def _chunks(names: list[str], sizes: Mapping[str, int], budget: int) -> list[list[str]]:
    """``names`` in order, cut where the next value would take a chunk past ``budget`` (0: one chunk)."""
    if not budget:
        return [names] if names else []
    chunks: list[list[str]] = []
    current: list[str] = []
    total = 0
    for name in names:
        size = sizes.get(name, 0)
        if current and total + size > budget:
            chunks.append(current)
            current, total = [], 0
        current.append(name)
        total += size
    if current:
        chunks.append(current)
    return chunks


def _moved_values(model) -> dict[str, list[str]]:
    """The values data movement computes in ``model``, each with the values it reads. Identities are looked
    through (verification stores each fp16 value by two: ``numeric._stored_in_fp16``), as their outputs carry
    what their input carries."""
    nodes = {name: node for node in model.graph.node for name in node.output if name}
    moved = {}
    for name, node in nodes.items():
        while node is not None and node.op_type == "Identity" and not node.domain and node.input:
            node = nodes.get(node.input[0])
        if node is not None and node.op_type in DATA_MOVEMENT and not node.domain:
            moved[name] = [i for i in node.input if i]
    return moved


def _infer(model, names: list[str], errors: dict[str, float], beyond: set[str]) -> None:
    """The error and range of values data movement computes, from what they read (in graph order)."""
    movers = _moved_values(model)
    for name in names:
        read = movers.get(name, [])
        carried = [errors[i] for i in read if i in errors]
        if carried:
            errors[name] = max(carried)
        if any(i in beyond for i in read):
            beyond.add(name)


def _run(segments: "_Segments", names: list[str]) -> dict[str, Any]:
    """``names`` as ``segments``' model computes them (one chunk)."""
    return segments.run(names)


class _Segments:
    """One model run a chunk of values at a time, each node once: a chunk's session holds the nodes its values
    depend on that no earlier chunk ran, its inputs the values earlier chunks kept for it (as computed, with
    their types taken from the arrays: the input model need not declare them), its outputs the chunk's values,
    the values of chunks still to come, and those that nodes not yet run read. A kept value that is not an
    array of numbers (a sequence, strings) is computed again instead."""

    def __init__(self, model, feeds: Mapping[str, Any], pending: Iterable[str]):
        self.model, self.feeds = model, feeds
        graph = model.graph
        self.producer = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
        self.reads = [_reads(node) for node in graph.node]
        self.readers: dict[str, set[int]] = {}
        for index, names in enumerate(self.reads):
            for name in names:
                self.readers.setdefault(name, set()).add(index)
        self.pending = set(pending)
        self.ran: set[int] = set()
        self.kept: dict[str, Any] = {}

    def _available(self, name: str) -> bool:
        """Kept as an array of a type a session input can declare (not a sequence, not strings)."""
        import numpy as np

        value = self.kept.get(name)
        return isinstance(value, np.ndarray) and value.dtype.kind in "biufc"

    def _needed(self, names: Iterable[str]) -> set[int]:
        needed: set[int] = set()
        seen: set[str] = set()
        stack = [name for name in names if not self._available(name)]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            index = self.producer.get(name)
            if index is None or index in needed:
                continue
            needed.add(index)
            stack.extend(read for read in self.reads[index] if not self._available(read))
        return needed

    def run(self, names: list[str]) -> dict[str, Any]:
        needed = self._needed(names)
        if needed:
            self._run_nodes(needed, names)
        found = {name: self.kept[name] for name in names}
        self.pending.difference_update(names)
        for name in list(self.kept):
            if name not in self.pending and self.readers.get(name, set()) <= self.ran:
                del self.kept[name]
        return found

    def _run_nodes(self, needed: set[int], names: list[str]) -> None:
        import onnx

        from worker.engine.runtime import cpu_session, session_options

        ran = self.ran | needed
        graph = self.model.graph
        produced = [name for index in sorted(needed) for name in graph.node[index].output if name]
        wanted = set(names) | self.pending
        outputs = [name for name in produced
                   if name in wanted or not self.readers.get(name, set()) <= ran]
        inputs = sorted({read for index in needed for read in self.reads[index]
                         if self._available(read) and self.producer.get(read) not in needed})
        kept_nodes, kept_inputs, kept_outputs = list(graph.node), list(graph.input), list(graph.output)
        try:
            del graph.node[:]
            graph.node.extend(kept_nodes[index] for index in sorted(needed))
            graph.input.extend(_typed(name, self.kept[name]) for name in inputs)
            del graph.output[:]
            graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
            serialized = self.model.SerializeToString()
        finally:
            del graph.node[:]
            graph.node.extend(kept_nodes)
            del graph.input[:]
            graph.input.extend(kept_inputs)
            del graph.output[:]
            graph.output.extend(kept_outputs)
        session = cpu_session(serialized, session_options(arena=False))
        del serialized
        given = {**self.feeds, **{name: self.kept[name] for name in inputs}}
        accepted = {i.name for i in session.get_inputs()}
        results = session.run(outputs, {k: v for k, v in given.items() if k in accepted})
        self.kept.update(zip(outputs, results))
        self.ran = ran


def _typed(name: str, array) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape))


def _ancestors(graph, names: Iterable[str]) -> set[int]:
    """The indices of the nodes ``names`` depend on (a node with a subgraph depends on every name its
    subgraphs read)."""
    producer = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
    needed: set[int] = set()
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        index = producer.get(name)
        if index is None or index in needed:
            continue
        needed.add(index)
        stack.extend(_reads(graph.node[index]))
    return needed


def _reads(node) -> list[str]:
    from onnx import AttributeProto

    names = [name for name in node.input if name]
    for attribute in node.attribute:
        bodies = [attribute.g] if attribute.type == AttributeProto.GRAPH else \
            list(attribute.graphs) if attribute.type == AttributeProto.GRAPHS else []
        for body in bodies:
            for inner in body.node:
                names += _reads(inner)
    return names


def _is_beyond(a, fp16_max: float) -> bool:
    import numpy as np

    if not isinstance(a, np.ndarray) or a.dtype.kind != "f" or not a.size:
        return False
    return float(np.max(np.abs(np.where(np.isfinite(a), a, 0)))) > fp16_max


def _error(a, b, rtol: float, atol: float, not_finite: float) -> float | None:
    """The largest ``|b - a| / (atol + rtol * |a|)`` over the elements (an NHWC ``b`` compared transposed back),
    or None where the two cannot be compared (not numeric arrays, or shapes that differ otherwise). Integers
    count: a quantized value one step off is where an int8 kernel's rounding shows."""
    import numpy as np

    numeric = "fiu"
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.dtype.kind not in numeric \
            or b.dtype.kind not in numeric:
        return None
    if b.shape != a.shape and b.ndim == 4 and b.shape == (a.shape[0], a.shape[2], a.shape[3], a.shape[1]):
        b = b.transpose(0, 3, 1, 2)
    if b.shape != a.shape or a.size == 0:
        return None
    a, b = a.reshape(-1), b.reshape(-1)
    worst = 0.0
    for start in range(0, a.size, BLOCK):  # float64 copies of a block at a time, not of the whole value
        a64, b64 = a[start:start + BLOCK].astype(np.float64), b[start:start + BLOCK].astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            equal = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
            diff = np.where(equal, 0.0, np.abs(a64 - b64))
            ratio = diff / (atol + rtol * np.abs(np.where(np.isfinite(a64), a64, 0.0)))
        worst = max(worst, float(np.where(np.isfinite(ratio), ratio, not_finite).max()))
    return min(worst, not_finite)
