"""The SSA graph: nodes in order, an op-type index, and the edit primitives every pass uses.

Nodes form a doubly linked list, so inserting and removing are O(1), and carry order keys, so comparing two
positions is O(1). The op-type index is updated by every insertion and removal, so a pass finds its candidate
nodes without scanning the graph. Names are unique across the whole model, nested bodies included, because
ONNX forbids a body from shadowing an outer name.
"""
from __future__ import annotations

import heapq
import re
from collections import defaultdict
from typing import Iterable, Iterator, Sequence

import numpy as np

from worker.engine.errors import ModelError
from worker.engine.ir.journal import created, journaled, touch, tracked
from worker.engine.ir.node import Attr, Node
from worker.engine.ir.value import ConstSource, Shape, Value, merged_shape

_GAP = 1 << 16


@journaled
class Names:
    """Model-wide registry of value and node names, handing out fresh ones on request."""

    def __init__(self) -> None:
        created(self)
        self.values: set[str] = set()
        self.nodes: set[str] = set()
        self._next: dict[str, int] = {}

    def _journal_state(self) -> tuple:
        return set(self.values), set(self.nodes), dict(self._next)

    def _journal_restore(self, state: tuple) -> None:
        object.__setattr__(self, "values", state[0])
        object.__setattr__(self, "nodes", state[1])
        object.__setattr__(self, "_next", state[2])

    def fresh(self, base: str, taken: set[str]) -> str:
        touch(self)
        base = base or "v"
        if base not in taken:
            taken.add(base)
            return base
        stem = re.sub(r"__\d+$", "", base)
        n = self._next.get(stem, 0)
        while f"{stem}__{n}" in taken:
            n += 1
        self._next[stem] = n + 1
        name = f"{stem}__{n}"
        taken.add(name)
        return name


@journaled
class Graph:
    """A graph (or an If/Loop/Scan body, whose ``parent`` is the node holding it)."""

    def __init__(self, name: str = "", *, names: Names | None = None):
        created(self)
        self.name = name
        self.doc_string = ""
        self.metadata: dict[str, str] = tracked(None)
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self.parent: Node | None = None
        self.names = names or Names()
        # Parts of GraphProto that no pass reads; written back unchanged.
        self.sparse_initializers: list = []
        self.quantization_annotation: list = []
        self._head: Node | None = None
        self._tail: Node | None = None
        self._count = 0
        self._index: dict[tuple[str, str], dict[Node, None]] = defaultdict(dict)
        self._values: dict[str, Value] = {}
        #: The nodes holding If/Loop/Scan bodies: every pass walks all graphs, few nodes have any.
        self._holders: dict[Node, None] = {}

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {self._count} nodes)"

    def _journal_state(self) -> dict:
        state = {name: _copied(value) for name, value in vars(self).items()}
        state["_index"] = defaultdict(dict, {key: dict(nodes) for key, nodes in self._index.items()})
        return state

    def _journal_restore(self, state: dict) -> None:
        fields = vars(self)
        fields.clear()
        fields.update(state)

    # --- reading -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Node]:
        """Nodes in order; removing the current node while iterating is safe."""
        node = self._head
        while node is not None:
            following = node._next
            yield node
            node = following

    def nodes_of_type(self, op_type: str, domain: str = "") -> list[Node]:
        """Nodes of one op type, in graph order, straight from the index."""
        found = self._index.get((domain, op_type))
        return sorted(found, key=lambda n: n._order) if found else []

    def count_of_type(self, op_type: str, domain: str = "") -> int:
        """How many nodes of one op type this graph has (not its bodies), in O(1)."""
        found = self._index.get((domain, op_type))
        return len(found) if found else 0

    def op_types(self) -> set[tuple[str, str]]:
        return {key for key, nodes in self._index.items() if nodes}

    def value(self, name: str) -> Value | None:
        """A value defined in this graph (input, initializer or node output)."""
        return self._values.get(name)

    def lookup(self, name: str) -> Value | None:
        """A value visible from this graph: its own, or an outer graph's."""
        graph: Graph | None = self
        while graph is not None:
            found = graph._values.get(name)
            if found is not None:
                return found
            graph = graph.parent.graph if graph.parent is not None else None
        return None

    def values(self) -> Iterator[Value]:
        return iter(self._values.values())

    @property
    def value_count(self) -> int:
        return len(self._values)

    @property
    def root(self) -> "Graph":
        graph = self
        while graph.parent is not None and graph.parent.graph is not None:
            graph = graph.parent.graph
        return graph

    def all_nodes(self) -> Iterator[Node]:
        """Every node, nested bodies included (a body's nodes come right after the node holding it)."""
        for node in self:
            yield node
            for body in node.subgraphs():
                yield from body.all_nodes()

    def all_graphs(self) -> Iterator["Graph"]:
        """This graph, then each body in the order of the nodes holding them (each body before its own)."""
        yield self
        for node in sorted(self._holders, key=lambda n: n._order):
            for body in node.subgraphs():
                yield from body.all_graphs()

    def live_graphs(self) -> Iterator["Graph"]:
        """Like ``all_graphs``, for a pass that edits as it goes: each graph is yielded only if it is still
        this graph or attached to it when its turn comes (an edit may have removed the node holding a body),
        and bodies an edit adds are not visited."""
        for graph in list(self.all_graphs()):
            if graph.is_within(self):
                yield graph

    def is_within(self, outer: "Graph") -> bool:
        """This graph is ``outer`` or a (nested) body of it whose holders are all still in their graphs."""
        graph = self
        while graph is not outer:
            holder = graph.parent
            if holder is None or holder.graph is None:
                return False
            graph = holder.graph
        return True

    def note_bodies(self, node: Node) -> None:
        """Record whether ``node`` (of this graph) holds bodies; called when its attributes change."""
        touch(self)
        if node.subgraphs():
            self._holders[node] = None
        else:
            self._holders.pop(node, None)

    def ancestor_in(self, node: Node) -> Node | None:
        """The node of this graph that is ``node`` or holds it in a (nested) body."""
        while node.graph is not self:
            if node.graph is None or node.graph.parent is None:
                return None
            node = node.graph.parent
        return node

    # --- values ------------------------------------------------------------------------------------
    def make_value(self, base: str, dtype: int = 0, shape: Shape | None = None) -> Value:
        """A new unattached value with a fresh name (attach it as a node output or initializer)."""
        return Value(self.names.fresh(base, self.names.values), dtype, shape)

    def _register_value(self, value: Value) -> None:
        touch(self)
        touch(self.names)
        existing = self._values.get(value.name)
        if existing is not None and existing is not value:
            raise ModelError(f"value name {value.name!r} is defined twice in graph {self.name!r}")
        self.names.values.add(value.name)
        self._values[value.name] = value
        value.graph = self

    def _forget_value(self, value: Value) -> None:
        touch(self)
        touch(self.names)
        if self._values.get(value.name) is value:
            del self._values[value.name]
            self.names.values.discard(value.name)

    def add_input(self, value: Value) -> Value:
        self._register_value(value)  # saves this graph first
        value._is_input = True
        self.inputs.append(value)
        return value

    def remove_input(self, value: Value) -> None:
        """Drop a graph input; an input that is also an initializer stays an initializer."""
        if value.uses and not value.is_initializer:
            raise ValueError(f"graph input {value.name!r} is still used")
        touch(self)
        self.inputs.remove(value)
        value._is_input = False
        if not value.is_initializer:
            self._forget_value(value)

    def add_initializer(self, name: str, data: np.ndarray | ConstSource, *, exact_name: bool = False) -> Value:
        """Add a constant; the name is made unique unless ``exact_name`` (then a clash is an error)."""
        touch(self)
        if not exact_name:
            name = self.names.fresh(name, self.names.values)
        value = self._values.get(name) if exact_name else None
        if value is None or not value.is_graph_input:
            value = Value(name)
            self._register_value(value)
        if isinstance(data, ConstSource):
            value._source = data
        else:
            value.const = data
        value.dtype = data.dtype if isinstance(data, ConstSource) else _onnx_dtype(data)
        value.shape = data.shape if isinstance(data, ConstSource) else tuple(int(d) for d in data.shape)
        self.initializers[name] = value
        return value

    def remove_initializer(self, value: Value) -> None:
        if value.uses or value.is_graph_output:
            raise ValueError(f"initializer {value.name!r} is still used")
        touch(self)
        self.initializers.pop(value.name, None)
        value._const = value._source = None
        if value.is_graph_input:
            self.inputs.remove(value)
            value._is_input = False
        self._forget_value(value)

    def set_outputs(self, values: Sequence[Value]) -> None:
        touch(self)
        for value in self.outputs:
            value._output_count -= 1
        self.outputs = list(values)
        for value in self.outputs:
            value._output_count += 1

    def replace_output(self, index: int, value: Value) -> None:
        touch(self)
        self.outputs[index]._output_count -= 1
        self.outputs[index] = value
        value._output_count += 1

    def rename_value(self, value: Value, new_name: str) -> None:
        if new_name == value.name:
            return
        if new_name in self.names.values:
            raise ValueError(f"value name {new_name!r} is taken")
        home = value.graph or self
        home._forget_value(value)  # saves the graph and the names first
        if home.initializers.get(value.name) is value:
            # O(1): the renamed initializer moves to the end; initializer order has no meaning in ONNX.
            del home.initializers[value.name]
            home.initializers[new_name] = value
        value.name = new_name
        home._register_value(value)

    def rename_fresh(self, value: Value, base: str) -> str:
        """Rename ``value`` to a fresh name derived from ``base``; returns the name."""
        name = self.names.fresh(base, self.names.values)  # saves the names first
        self.names.values.discard(name)  # reserved by fresh(); rename_value registers it
        self.rename_value(value, name)
        return name

    # --- node list ---------------------------------------------------------------------------------
    def _register_node(self, node: Node) -> None:
        if node.graph is not None:
            raise ValueError(f"{node!r} already belongs to a graph")
        touch(self)
        node.graph = self
        node.name = self.names.fresh(node.name or node.op_type.lower(), self.names.nodes)
        self._index[(node.domain, node.op_type)][node] = None
        for value in node.outputs:
            self._register_value(value)
        for body in node.subgraphs():
            body.parent = node
        self.note_bodies(node)
        self._count += 1

    def append(self, node: Node) -> Node:
        self._register_node(node)
        node._prev, node._next = self._tail, None
        if self._tail is None:
            self._head = node
            node._order = _GAP
        else:
            self._tail._next = node
            node._order = self._tail._order + _GAP
        self._tail = node
        return node

    def insert_before(self, anchor: Node, node: Node) -> Node:
        if anchor.graph is not self:
            raise ValueError(f"{anchor!r} is not in this graph")
        self._register_node(node)
        prev = anchor._prev
        node._prev, node._next = prev, anchor
        anchor._prev = node
        if prev is None:
            self._head = node
        else:
            prev._next = node
        self._set_order_between(node, prev, anchor)
        return node

    def insert_after(self, anchor: Node, node: Node) -> Node:
        if anchor._next is None:
            if anchor.graph is not self:
                raise ValueError(f"{anchor!r} is not in this graph")
            return self.append(node)
        return self.insert_before(anchor._next, node)

    def _set_order_between(self, node: Node, prev: Node | None, following: Node) -> None:
        low = prev._order if prev is not None else 0
        if following._order - low >= 2:
            node._order = (low + following._order) // 2
        else:
            self._renumber()

    def _renumber(self) -> None:
        for i, node in enumerate(self, start=1):
            node._order = i * _GAP

    def add_node(self, op_type: str, inputs: Iterable[Value | None], outputs: int | Sequence[str | Value] = 1, *,
                 domain: str = "", name: str = "", attributes: dict | None = None,
                 before: Node | None = None, after: Node | None = None) -> Node:
        """Build a node and put it at the end, or before/after an anchor.

        ``outputs`` is a count, or a list of base names for fresh values and existing values. An existing
        value is taken over from its producer (which gets a fresh unused value in that slot and is normally
        removed next): a fused node produces the very value the pattern produced, name, type and uses kept.
        ``attributes`` maps names to Python values.
        """
        if isinstance(outputs, int):
            outputs = [f"{name or op_type.lower()}_out{i}" for i in range(outputs)]
        values = [self._take_over(v) if isinstance(v, Value) else self.make_value(v) for v in outputs]
        node = Node(op_type, inputs, values, domain=domain, name=name)
        for key, val in (attributes or {}).items():
            node.attributes[key] = val if isinstance(val, Attr) else Attr.infer(key, val)
        if before is not None:
            return self.insert_before(before, node)
        if after is not None:
            return self.insert_after(after, node)
        return self.append(node)

    def _take_over(self, value: Value) -> Value:
        old = value.producer
        if old is not None:
            touch(old)
            placeholder = self.make_value(value.name + "_replaced")
            placeholder.copy_type_from(value)
            placeholder.producer, placeholder.producer_slot = old, value.producer_slot
            old.outputs[value.producer_slot] = placeholder
            if old.graph is not None:
                old.graph._register_value(placeholder)
            value.producer = None
        return value

    def _unlink(self, node: Node) -> None:
        touch(self)
        touch(self.names)
        if node._prev is None:
            self._head = node._next
        else:
            node._prev._next = node._next
        if node._next is None:
            self._tail = node._prev
        else:
            node._next._prev = node._prev
        node._prev = node._next = None
        self._index[(node.domain, node.op_type)].pop(node, None)
        self._holders.pop(node, None)
        for value in node.outputs:
            self._forget_value(value)
        self.names.nodes.discard(node.name)
        node.graph = None
        self._count -= 1

    def remove_node(self, node: Node) -> None:
        """Remove a node whose outputs nobody uses any more."""
        self.remove_nodes([node])

    def remove_nodes(self, nodes: Iterable[Node]) -> None:
        """Remove nodes in one batch; their outputs may be used only by nodes of the same batch."""
        batch = list(dict.fromkeys(nodes))
        members = set(batch)
        for node in batch:
            if node.graph is not self:
                raise ValueError(f"{node!r} is not in this graph")
            for value in node.outputs:
                if value.is_graph_output:
                    raise ValueError(f"cannot remove {node!r}: {value.name!r} is a graph output")
                outside = [u.node for u in value.uses if self.ancestor_in(u.node) not in members]
                if outside:
                    raise ValueError(f"cannot remove {node!r}: {value.name!r} is still used by {outside[0]!r}")
        for node in batch:
            node.detach_inputs()
            for body in node.subgraphs():
                for inner in body.all_nodes():
                    inner.detach_inputs()
        for node in batch:
            self._unlink(node)

    def remove_unused(self, items: Iterable[Value | Node]) -> list[str]:
        """Remove what nobody uses any more among ``items``, then what that frees in turn.

        A value goes when it is unused: an initializer is removed, a node output takes its producer along once
        every output of that producer is unused (and then the producer's inputs are looked at, nested bodies
        included). A node goes when none of its outputs is used. Graph inputs and outputs are never removed,
        and items of any graph of the model may be given. Returns the names of the removed nodes, in order.
        """
        removed: list[str] = []
        pending: list[Value | Node] = list(items)
        while pending:
            item = pending.pop()
            if isinstance(item, Value):
                if item.is_used or item.graph is None or item.is_graph_input:
                    continue
                if item.is_initializer:
                    item.graph.remove_initializer(item)
                    continue
                item = item.producer
                if item is None:
                    continue
            node, graph = item, item.graph
            if graph is None or any(out.is_used for out in node.outputs):
                continue
            freed = [v for v in node.inputs if v is not None]
            freed += [v for body in node.subgraphs() for inner in body.all_nodes() for v in inner.inputs
                      if v is not None and v.graph is not None and not v.graph.is_within(body)]
            graph.remove_node(node)
            removed.append(node.name)
            pending.extend(reversed(freed))
        return removed

    def move_before(self, node: Node, before: Node) -> None:
        """Move ``node`` (of this graph or of any other, a body for one) right before ``before`` in this graph,
        keeping its name, its inputs and the uses of its outputs.

        Names are unique model-wide, so nothing is renamed; the caller makes sure every value the node reads
        is visible from this graph and that the move keeps the order topological.
        """
        if before.graph is not self:
            raise ValueError(f"{before!r} is not in this graph")
        node.graph._unlink(node)  # keeps the inputs and their uses; forgets the outputs in the old graph
        self.insert_before(before, node)

    # --- rewiring ----------------------------------------------------------------------------------
    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Make every consumer of ``old`` read ``new`` (nested bodies included); graph outputs are left.

        Use ``bypass`` when ``old`` may be a graph output.
        """
        for use in list(old.uses):
            use.node.set_input(use.slot, new)

    def bypass_refusal(self, old: Value, new: Value) -> str | None:
        """Why ``bypass(old, new)`` would change nothing, as a sentence for a trace; None when it will succeed."""
        if not old.is_graph_output:
            return None
        if new.producer is None or new.graph is not self:
            return (f"{old.name!r} is a graph output and {new.name!r} is not produced by a node of the same "
                    f"graph, so the output cannot keep its name")
        if new.is_graph_output or new.is_graph_input:
            return f"{old.name!r} and {new.name!r} are both graph inputs or outputs, so one name would be lost"
        if old.dtype and new.dtype and old.dtype != new.dtype:
            return f"graph output {old.name!r} would change its element type"
        return None

    def bypass(self, old: Value, new: Value) -> bool:
        """Replace ``old`` by ``new`` everywhere, keeping graph output names and types.

        When ``old`` is a graph output, ``new`` takes over its name, which is possible only when ``new`` is
        produced by a node of this graph, is not itself a graph input or output, and has the same dtype.
        Returns False (and changes nothing) when that is not possible (``bypass_refusal`` says why).

        The two are one tensor, so ``new`` keeps what ``old``'s type knew that its own did not (``old``'s
        readers would otherwise read ``(unk__0, 256)`` where they read ``(batch, 256)``), except where ``new``
        is a graph input, whose declared type is the model's interface.
        """
        if old.is_graph_output:
            if self.bypass_refusal(old, new) is not None:
                return False
            self.replace_all_uses(old, new)
            name = old.name
            self.rename_fresh(old, name + "_replaced")
            self.rename_value(new, name)
            if old.shape is not None:
                new.shape = old.shape
            new.dtype = old.dtype or new.dtype
            for i, value in enumerate(self.outputs):
                if value is old:
                    self.replace_output(i, new)
            return True
        self.replace_all_uses(old, new)
        if not new.is_graph_input:
            known = merged_shape(new.shape, old.shape)
            if known != new.shape:
                new.shape = known
        return True

    # --- order -------------------------------------------------------------------------------------
    def successors(self) -> dict[Node, list[Node]]:
        """Data dependencies between this graph's nodes, uses inside nested bodies included."""
        following: dict[Node, list[Node]] = {}
        for node in self:
            succ = []
            for value in node.outputs:
                for use in value.uses:
                    top = self.ancestor_in(use.node)
                    if top is not None and top is not node:
                        succ.append(top)
            following[node] = succ
        return following

    def toposort(self) -> bool:
        """Put nodes in topological order, keeping the current order where it already is one.

        Returns True when the order changed. A cycle is a ModelError naming a node on it.
        """
        following = self.successors()
        indegree = {node: 0 for node in following}
        for succ in following.values():
            for node in succ:
                indegree[node] += 1
        ready = [node for node in self if indegree[node] == 0]
        heap = [(node._order, id(node), node) for node in ready]
        heapq.heapify(heap)
        order: list[Node] = []
        while heap:
            _, _, node = heapq.heappop(heap)
            order.append(node)
            for succ in following[node]:
                indegree[succ] -= 1
                if indegree[succ] == 0:
                    heapq.heappush(heap, (succ._order, id(succ), succ))
        if len(order) != self._count:
            stuck = next(n for n in self if indegree[n] > 0)
            raise ModelError(f"graph {self.name!r} has a cycle through node {stuck.name!r} ({stuck.op_type})")
        changed = any(a is not b for a, b in zip(order, self))
        if changed:
            self._relink(order)
        return changed

    def _relink(self, order: list[Node]) -> None:
        touch(self)
        prev = None
        for i, node in enumerate(order, start=1):
            node._prev, node._next, node._order = prev, None, i * _GAP
            if prev is None:
                self._head = node
            else:
                prev._next = node
            prev = node
        self._tail = prev

    def is_sorted(self) -> bool:
        return all(s._order > node._order for node, succ in self.successors().items() for s in succ)


def _copied(value):
    """A container copied one level (a graph's state for the journal), anything else as it is; the metadata
    dict saves itself."""
    if isinstance(value, defaultdict):
        return defaultdict(value.default_factory, value)
    if type(value) in (dict, list, set):
        return type(value)(value)
    return value


def _onnx_dtype(data: np.ndarray) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.asarray(data).dtype)
