"""Verification by regions: a model too large to run twice in time is compared with its input only where the
optimized graph differs from it.

Matching. Walking back from the graph outputs, each value of the optimized graph (the candidate) is paired
with the value of the input graph (the original) it must equal, first each output with the output of the same
name. Where both are computed by the same node -- same op, domain, attributes and output slot, each weight
the same (the same bytes of the same file, which the caller knows for the weights the optimizer left
untouched, or equal bytes for small ones) -- the pair holds when the node's inputs pair up, and the walk goes
on to them (their names may differ: a rewrite upstream dropped a node, a Mul by ones). Where they differ, the
pair is an output of a region.

Regions. A region is the candidate's nodes back from its outputs and the original's nodes back from theirs,
down to boundary values: values of the same name, element type and shape in both graphs, which the walk
then pairs in turn. A boundary must be computed outside the region on both sides, and verification must be
able to draw it: a float value of known shape, or a value the original computes cheaply from the graph inputs
(its prefix: nodes without a weight over 4 MiB, such as the sequence length, rotary tables and causal mask
of a decoder), which gets its real value. Otherwise -- a value computed inside the region on the other side,
an integer or boolean (positions, indices) the prefix does not compute, a shape shape inference leaves
open -- the region grows through it to its producers. Regions that share a node merge.

Running. For each set of input shapes and run, the graph inputs are drawn as whole-model verification draws
them (same seed), the prefix runs on them, and every other boundary gets seeded random values in [0, 1) of
its shape (from onnx shape inference on the original at those input shapes). Both sides of the regions run
on onnxruntime (``ChunkedSession.run_nodes``: regions batched into sessions of at most ``budget`` bytes of
weights, fed from the mapped files), and each pair is compared as verification compares outputs.

``RegionsRefused`` says why a pair of models cannot be verified so (outputs or inputs without a counterpart,
a value the walk cannot find, a region whose weights exceed four budgets); the caller then runs both models
whole, piece by piece.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from onnx import helper

from worker.engine.chunked import ChunkedSession

#: Weights compared byte for byte when the caller does not know them to be the same bytes.
SMALL_WEIGHT = 1 << 20
#: A node of the original's prefix reads no weight larger than this.
PREFIX_WEIGHT = 4 << 20
#: Initializers whose data shape inference is given: data propagation follows shape arithmetic (small integer
#: tensors, scalars); the other weights are declared by type and shape only. Giving it every weight up to 4 MiB
#: wrote BERT-base's 117 MB of projection matrices into the proto for each set of input shapes: 1.0 s of 1.05.
SHAPE_DATA_BYTES = 32 << 10  # 4096 int64 values
#: How many values a region may grow through before the walk gives up.
GROWTH_LIMIT = 10_000


class RegionsRefused(ValueError):
    """The models cannot be compared region by region (the message says why)."""


@dataclass
class Region:
    pairs: list[tuple[str, str]]  # (candidate value, original value) that must be equal
    candidate: list[int]  # positions in the candidate's node list, in order
    original: list[int]
    boundary: list[str]  # values fed to both sides
    weight_bytes: int = 0
    produced: set[str] = field(default_factory=set)  # what either side's nodes compute


def weight_key(value) -> tuple[str, int, int] | None:
    """Where an initializer's bytes are: (file, offset, length) of a mapped file, or None when they are not in
    one (built by a pass, or parsed by protobuf)."""
    source = value.const_source
    file = getattr(source, "file", None)
    if file is None or getattr(file, "path", None) is None:
        return None
    return (os.path.realpath(file.path), int(source.offset), int(source.nbytes))


class RegionPlan:
    """The regions where ``candidate`` differs from ``original``. ``same_weights`` maps each candidate weight
    the optimizer left untouched to ``weight_key`` of its bytes in the original's files."""

    def __init__(self, original: ChunkedSession, candidate: ChunkedSession,
                 same_weights: Mapping[str, Sequence], shape_sets: Sequence[Mapping[str, Sequence[int]]],
                 budget: int):
        self.o, self.c = original, candidate
        self.same_weights = {k: tuple(v) for k, v in same_weights.items()}
        self.budget = budget
        self.position = {side: {node: i for i, node in enumerate(side.nodes)} for side in (original, candidate)}
        self.inferred = [_infer(original, shapes) for shapes in shape_sets]
        # the candidate's types where it does not declare them (mirserve's writer does; other writers may not)
        self.c_inferred = _infer(candidate, shape_sets[0]) if any(
            not v.dtype for n in candidate.nodes for v in n.outputs) else {}
        self.prefix = _prefix(original)
        self.regions: list[Region] = []
        self.matched = 0
        self._attributes: dict[tuple[int, int], list[bytes]] = {}
        self._walk_pairs()

    # --- matching -----------------------------------------------------------------------------------
    def _walk_pairs(self) -> None:
        outputs = [v.name for v in self.c.graph.outputs]
        if outputs != [v.name for v in self.o.graph.outputs]:
            raise RegionsRefused("the optimized model's outputs are not those of the input model")
        inputs = {v.name for v in self.o.graph.inputs if not v.is_constant}
        extra = [v.name for v in self.c.graph.inputs if not v.is_constant and v.name not in inputs]
        if extra:
            raise RegionsRefused(f"the optimized model has an input the input model lacks: {extra[0]!r}")
        queue, seen, matched = [(n, n) for n in reversed(outputs)], set(), set()
        while queue:
            pair = queue.pop()
            if pair in seen:
                continue
            seen.add(pair)
            c, o = self.c.graph.value(pair[0]), self.o.graph.value(pair[1])
            if c is None or o is None:
                raise RegionsRefused(f"value {pair[0]!r} has no counterpart {pair[1]!r} in the input model")
            if c.is_constant and o.is_constant and self._same_weight(c, o):
                continue
            if c.producer is None and o.producer is None and not c.is_constant and not o.is_constant \
                    and c.name == o.name:
                continue  # the same graph input
            inputs_pairs = self._match(c, o)
            if inputs_pairs is not None:
                matched.add(c.producer)
                queue.extend(reversed(inputs_pairs))
                continue
            region = self._add_region([pair])
            queue.extend((b, b) for b in reversed(region.boundary))
        self.matched = len(matched)

    def _match(self, c, o) -> list[tuple[str, str]] | None:
        """The pairs of inputs that must be equal for ``c`` to equal ``o``, when the same node computes both;
        else None."""
        cn, on = c.producer, o.producer
        if cn is None or on is None or c.producer_slot != o.producer_slot:
            return None
        if (cn.op_type, cn.domain, len(cn.inputs), len(cn.outputs)) != \
                (on.op_type, on.domain, len(on.inputs), len(on.outputs)):
            return None
        if self._attrs(self.c, cn) != self._attrs(self.o, on):
            return None
        pairs = []
        for a, b in zip(cn.inputs, on.inputs):
            if a is None or b is None:
                if a is not b:
                    return None
            elif a.is_constant or b.is_constant:
                if not (a.is_constant and b.is_constant and self._same_weight(a, b)):
                    return None
            elif self._same_type(a, b):
                pairs.append((a.name, b.name))
            else:  # another type (a cast to fp32), or a dropped node the op makes up for (an Unsqueeze before
                return None  # a broadcast): the node is part of a region
        return pairs

    def _same_type(self, c, o) -> bool:
        """Two values of other names that could be equal: the same element type and rank, and the same
        dims where both are known."""
        dtype, shape = _typed(o, self.inferred[0])
        c_dtype, c_shape = _typed(c, self.c_inferred)
        if not dtype or dtype != c_dtype or shape is None or c_shape is None or len(shape) != len(c_shape):
            return False
        return all(not isinstance(a, int) or not isinstance(b, int) or a == b for a, b in zip(shape, c_shape))

    def _attrs(self, side: ChunkedSession, node) -> list[bytes]:
        key = (id(side), self.position[side][node])
        if key not in self._attributes:
            proto = side.node_protos[key[1]]
            self._attributes[key] = [a.SerializeToString() for a in sorted(proto.attribute, key=lambda a: a.name)]
        return self._attributes[key]

    def _same_weight(self, c, o) -> bool:
        if c.dtype != o.dtype or c.nbytes != o.nbytes or tuple(np.shape(c.const) if c.shape is None else c.shape) \
                != tuple(np.shape(o.const) if o.shape is None else o.shape):
            return False
        known = self.same_weights.get(c.name)
        if known is not None and known == weight_key(o):
            return True
        if c.nbytes > SMALL_WEIGHT:
            return False
        return np.asarray(c.const).tobytes() == np.asarray(o.const).tobytes()

    # --- regions --------------------------------------------------------------------------------------
    def _add_region(self, pairs: list[tuple[str, str]]) -> Region:
        while True:
            region = self._grow(pairs)
            c_nodes, o_nodes = set(region.candidate), set(region.original)
            overlapping = [r for r in self.regions if c_nodes.intersection(r.candidate)
                           or o_nodes.intersection(r.original)]
            if not overlapping:
                self.regions.append(region)
                return region
            for other in overlapping:
                self.regions.remove(other)
                pairs = pairs + [p for p in other.pairs if p not in pairs]

    def _grow(self, pairs: list[tuple[str, str]]) -> Region:
        blocked: set[str] = set()
        c_walk = _Walk(self, self.c, {c for c, o in pairs if c == o}, blocked)
        o_walk = _Walk(self, self.o, {o for c, o in pairs if c == o}, blocked)
        c_walk.extend([c for c, _ in pairs])
        o_walk.extend([o for _, o in pairs])
        while True:
            produced = c_walk.produced | o_walk.produced
            bad = {s for s in c_walk.stops | o_walk.stops if s in produced or not self._drawable(s)}
            if not bad and c_walk.stops != o_walk.stops:
                bad = self._derived_stops(c_walk.stops | o_walk.stops)
            if not bad:
                break
            blocked |= bad  # the walks read ``blocked``: each goes on through its own blocked stops
            if len(blocked) > GROWTH_LIMIT:
                raise RegionsRefused(f"the region of value {pairs[0][0]!r} grew through more than "
                                     f"{GROWTH_LIMIT} values without finding a boundary both models share")
            c_walk.reopen(bad)
            o_walk.reopen(bad)
        c_nodes, o_nodes = c_walk.nodes, o_walk.nodes
        weights = {v.name: v.nbytes for n in c_nodes for v in n.inputs if v is not None and v.is_constant}
        weights.update({f"original:{v.name}": v.nbytes for n in o_nodes for v in n.inputs
                        if v is not None and v.is_constant})
        total = sum(weights.values())
        if total > 4 * self.budget:
            raise RegionsRefused(f"the region of value {pairs[0][0]!r} reads {total >> 20} MiB of weights, more "
                                 f"than four pieces of {self.budget >> 20} MiB")
        return Region(list(pairs), sorted(self.position[self.c][n] for n in c_nodes),
                      sorted(self.position[self.o][n] for n in o_nodes), sorted(c_walk.stops | o_walk.stops),
                      total, c_walk.produced | o_walk.produced)

    def _derived_stops(self, stops: set[str]) -> set[str]:
        """The stops the original computes from another stop of the same region. Boundaries are drawn one by
        one, so such a pair gets values the original can never give it; where the two sides read different
        stops, one side may read the source (a rewrite dropped the view ops between, torch's MultiheadAttention
        keys read before their 4-D view) and the other the derived value, and their results differ on the draw
        alone. Growing through the derived stop leaves the source as the one boundary both sides read."""
        graph = self.o.graph
        order = [graph.value(s).producer for s in stops if graph.value(s) is not None]
        last = max((self.position[self.o][n] for n in order if n is not None), default=-1)
        bit = {name: 1 << i for i, name in enumerate(sorted(stops))}
        reached: dict[str, int] = dict(bit)  # value -> the stops it is computed from (a bit per stop)
        derived = set()
        for node in self.o.nodes[:last + 1]:
            found = 0
            for value in node.inputs:
                if value is not None:
                    found |= reached.get(value.name, 0)
            if not found:
                continue
            for value in node.outputs:
                own = bit.get(value.name, 0)
                if own and found & ~own:
                    derived.add(value.name)
                reached[value.name] = found | own
        return derived

    def _shared(self, name: str) -> bool:
        """Both graphs have a tensor of this name, of the same element type and a shape that agrees."""
        c, o = self.c.graph.value(name), self.o.graph.value(name)
        if c is None or o is None or c.is_constant or o.is_constant or c.type_proto is not None \
                or o.type_proto is not None:
            return False
        if o.producer is None and c.producer is None:
            return True  # a graph input of both
        return self._same_type(c, o)

    def _drawable(self, name: str) -> bool:
        """Verification can give this boundary a value: a graph input, a value of the prefix, or a float of
        known shape in every set of input shapes."""
        value = self.o.graph.value(name)
        if (value.producer is None and not value.is_constant) or name in self.prefix:
            return True
        for inferred in self.inferred:
            found = inferred.get(name)
            if found is None or found[1] is None or not all(isinstance(d, int) for d in found[1]):
                return False
            if not np.issubdtype(helper.tensor_dtype_to_np_dtype(found[0]), np.floating):
                return False
        return True

    # --- running --------------------------------------------------------------------------------------
    def batches(self) -> list[list[Region]]:
        """The regions in sessions: no region reads what another of its session computes, at most ``budget``
        bytes of weights and of drawn boundary values a session (a region alone may have more)."""
        batches: list[list[Region]] = []
        produced: set[str] = set()
        reads: set[str] = set()
        held = 0
        for region in sorted(self.regions, key=lambda r: (r.candidate or r.original or [0])[0]):
            size = region.weight_bytes + sum(self._drawn_bytes(b) for b in region.boundary if b not in reads)
            if not batches or held + size > self.budget or produced & set(region.boundary) \
                    or reads & region.produced:
                batches.append([])
                produced, reads, held = set(), set(), 0
                size = region.weight_bytes + sum(self._drawn_bytes(b) for b in region.boundary)
            batches[-1].append(region)
            produced |= region.produced
            reads |= set(region.boundary)
            held += size
        return batches

    def _drawn_bytes(self, name: str) -> int:
        """The largest a drawn boundary value is over the sets of input shapes (0 for the prefix's)."""
        sizes = [0]
        for inferred in self.inferred:
            dtype, dims = inferred.get(name, (0, None))
            if dims is not None and dtype and all(isinstance(d, int) for d in dims) and name not in self.prefix:
                itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).itemsize
                sizes.append(int(np.prod(dims, dtype=np.int64)) * itemsize)
        return max(sizes)

    def describe(self) -> dict[str, Any]:
        nodes = sum(len(r.candidate) for r in self.regions)
        ops = sorted({self.c.nodes[i].op_type for r in self.regions for i in r.candidate})
        return {"regions": len(self.regions), "region_nodes": nodes, "nodes": len(self.c.nodes), "region_ops": ops,
                "original_region_nodes": sum(len(r.original) for r in self.regions), "matched_nodes": self.matched}


class _Walk:
    """One side of a region: the nodes back from its starts down to the values both graphs share (except
    ``through``, the starts named alike on both sides, and ``blocked``), and those values (``stops``).

    A region grows by blocking stops it cannot use as boundaries; ``reopen`` walks on through them from where
    the walk stopped, so growing costs the nodes it adds, not a new walk from the starts each time (BERT-base's
    one large region grew through 460 values in 130 steps: a walk of the whole graph each step)."""

    def __init__(self, plan: RegionPlan, side: ChunkedSession, through: set[str], blocked: set[str]):
        self.plan, self.side, self.through, self.blocked = plan, side, through, blocked
        self.nodes: set = set()
        self.stops: set[str] = set()
        self.produced: set[str] = set()
        self.seen: set[str] = set()

    def extend(self, names) -> None:
        stack = list(names)
        while stack:
            name = stack.pop()
            if name in self.seen:
                continue
            self.seen.add(name)
            value = self.side.graph.value(name)
            if value is None:
                raise RegionsRefused(f"value {name!r} is read but not defined")
            if value.is_constant:
                continue  # a weight of the nodes that read it
            if name not in self.through and name not in self.blocked and self.plan._shared(name):
                self.stops.add(name)
                continue
            stack.extend(self._enter(value))

    def reopen(self, names: set[str]) -> None:
        """Walk on through the stops among ``names`` (now blocked)."""
        stack = []
        for name in names & self.stops:
            self.stops.discard(name)
            stack.extend(self._enter(self.side.graph.value(name)))
        self.extend(stack)

    def _enter(self, value) -> list[str]:
        """Take ``value``'s producer into the region; the names of its inputs, to walk next."""
        if value.producer is None:
            raise RegionsRefused(f"graph input {value.name!r} has no counterpart in the other model")
        node = value.producer
        if node not in self.nodes:
            self.nodes.add(node)
            self.produced.update(v.name for v in node.outputs)
        return [v.name for v in node.inputs if v is not None]


def _infer(session: ChunkedSession, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, tuple | None]]:
    """Element type and shape of each value of the original at these input shapes (onnx shape inference with
    data propagation; a dim it cannot tell is a str or None)."""
    import onnx

    proto = type(session.template)()
    proto.CopyFrom(session.template)
    graph = proto.graph
    graph.node.extend(session.node_protos)
    for value in session.graph.inputs:
        if value.is_constant:
            continue
        dims = shapes.get(value.name)
        graph.input.append(helper.make_tensor_value_info(value.name, value.dtype, list(dims) if dims is not None
                                                         else None))
    for value in session.graph.initializers.values():  # types only: shape inference needs no data
        graph.input.append(helper.make_tensor_value_info(value.name, value.dtype, list(np.shape(value.const))
                                                         if value.shape is None else list(value.shape)))
    small = [v for v in session.graph.initializers.values() if v.nbytes <= SHAPE_DATA_BYTES]
    graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(v.const), v.name) for v in small)
    for value in small:
        value.release_pages()
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # noqa: BLE001 - nothing inferred: only graph inputs and the prefix are drawable
        return {}
    found = {}
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type if info.type.HasField("tensor_type") else None
        if tensor is None:
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim) \
            if tensor.HasField("shape") else None
        found[info.name] = (tensor.elem_type, dims)
    return found


def _typed(value, inferred: Mapping[str, tuple]) -> tuple[int, tuple | None]:
    """A value's element type and shape: as the graph declares them, else as shape inference found them."""
    dtype, shape = value.dtype, value.shape
    found = inferred.get(value.name)
    if found is not None:
        dtype, shape = dtype or found[0], found[1] if found[1] is not None else shape
    return dtype, shape


def _prefix(session: ChunkedSession) -> set[str]:
    """Values the original computes from its graph inputs and small weights only."""
    known = {v.name for v in session.graph.inputs if not v.is_constant}
    for node in session.nodes:
        if all(v is None or v.name in known or (v.is_constant and v.nbytes <= PREFIX_WEIGHT) for v in node.inputs):
            known.update(v.name for v in node.outputs)
    return known - {v.name for v in session.graph.inputs}


def _prefix_nodes(session: ChunkedSession, wanted: set[str]) -> list[int]:
    """Positions of the prefix nodes that compute ``wanted``."""
    needed, stack, nodes = set(), list(wanted), set()
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        value = session.graph.value(name)
        if value is None or value.producer is None:
            continue
        nodes.add(value.producer)
        stack.extend(v.name for v in value.producer.inputs if v is not None and not v.is_constant)
    return sorted(i for i, node in enumerate(session.nodes) if node in nodes)


def _draw(dtype: int, shape: Sequence[int], rng) -> np.ndarray:
    """Seeded values in [0, 1), as verification draws float inputs (float32 draws for the narrower types)."""
    np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(dtype))
    drawn = rng.random(list(shape), dtype=np.float64 if np_dtype == np.float64 else np.float32)
    return np.asarray(drawn).astype(np_dtype, copy=False)


def verify_regions(plan: RegionPlan, feeds_for, shape_sets: Sequence[Mapping[str, Sequence[int]]], *, runs: int,
                   seed: int, rtol: float, atol: float, compare) -> dict[str, Any]:
    """Run every region on both sides for each set of input shapes and run; ``feeds_for(shapes, rng)`` draws
    the graph inputs as whole-model verification does, ``compare`` is its comparison."""
    batches = plan.batches()
    results: dict[str, dict] = {}
    for index, shapes in enumerate(shape_sets):
        for run in range(runs):
            known = _known_values(plan, feeds_for(shapes, np.random.default_rng(seed + run)))
            for batch in batches:  # a batch's drawn values only, dropped with it
                env = _drawn(plan, batch, index, known, seed + run)
                expected = _side(plan.o, [r.original for r in batch], [o for r in batch for _, o in r.pairs], env)
                actual = _side(plan.c, [r.candidate for r in batch], [c for r in batch for c, _ in r.pairs], env)
                for region in batch:
                    for c, o in region.pairs:
                        entry = {**compare(c, expected[o], actual[c], rtol, atol, run), "set": index}
                        if c not in results or entry["excess"] > results[c]["excess"]:
                            results[c] = entry
    outputs = _described(plan, results)
    return {"passed": all(e["passed"] for e in outputs), "outputs": outputs, **plan.describe()}


def _known_values(plan: RegionPlan, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """The boundary values that are not drawn: the graph inputs ``feeds`` and the values of the original's
    prefix computed from them."""
    env: dict[str, Any] = dict(feeds)
    prefixed = sorted({b for r in plan.regions for b in r.boundary if b in plan.prefix})
    if prefixed:
        env.update(zip(prefixed, plan.o.run_nodes(_prefix_nodes(plan.o, set(prefixed)), prefixed, env,
                                                  keep=True)))
    return env


def _drawn(plan: RegionPlan, batch: list[Region], index: int, known: Mapping[str, Any], seed: int) -> dict:
    """``known`` and the other boundary values of a batch at set ``index`` of input shapes: seeded random
    values of the inferred shapes, each from a generator of its own name (the same in every batch)."""
    env = dict(known)
    for name in sorted({b for region in batch for b in region.boundary}):
        if name not in env:
            dtype, dims = plan.inferred[index][name]
            env[name] = _draw(dtype, dims, np.random.default_rng([seed, index, zlib.crc32(name.encode())]))
    return env


def _described(plan: RegionPlan, results: Mapping[str, dict]) -> list[dict]:
    """The comparisons in region order, each naming its region and the original's value; a failed one says
    what the region holds."""
    where = {c: (number, o) for number, region in enumerate(plan.regions) for c, o in region.pairs}
    outputs = []
    for name, entry in results.items():
        number, original = where[name]
        region = plan.regions[number]
        entry = {**entry, "region": number, "original": original}
        if not entry["passed"]:
            ops = sorted({plan.c.nodes[i].op_type for i in region.candidate}) or ["no node"]
            entry["note"] = (f"a value of region {number} ({', '.join(ops)} in the optimized model, "
                             f"{len(region.original)} node(s) of the input model), compared with {original!r}")
        outputs.append(entry)
    return sorted(outputs, key=lambda e: (e["region"], e["name"]))


def _side(side: ChunkedSession, positions: list[list[int]], names: list[str], env: Mapping[str, Any]) -> dict:
    """The values ``names`` on one side: computed by the nodes at ``positions`` from ``env``, or taken from
    ``env`` (a boundary) or the weights."""
    nodes = sorted({i for group in positions for i in group})
    produced = {v.name for i in nodes for v in side.nodes[i].outputs}
    computed = sorted({n for n in names if n in produced})
    values = dict(zip(computed, side.run_nodes(nodes, computed, env, keep=True))) if computed else {}
    for name in names:
        if name not in values:
            value = side.graph.value(name)
            values[name] = env[name] if name in env else np.array(value.const)
    return values

