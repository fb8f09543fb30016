"""Running a model larger than memory on onnxruntime, a slice of its weights at a time (for verification).

onnxruntime loads every initializer of a session, and a page of weights it maps stays in the resident set
once touched, so a 13 GB model cannot be verified in bounded memory as one session. ``ChunkedSession`` runs it
as consecutive pieces: the model is loaded into the IR (weights stay in their mapped files), its nodes, in
topological order, are cut into pieces whose weights total at most ``budget`` bytes (a piece holds at least one
node, so the largest single weight is the floor), and each piece becomes a model of its own, with its weights
inline, whose inputs are the values earlier pieces computed. A piece's session is made, run and dropped before
the next one is made; values are kept only until their last reader has run. The outputs are those of the whole
model, computed by the same onnxruntime kernels on the same inputs, so verification compares them as it would
the outputs of one session.

It offers the part of onnxruntime's ``InferenceSession`` that verification uses (``get_inputs``,
``get_outputs``, ``run``). Models with subgraphs (If, Loop, Scan) are not cut (a body reads outer values
implicitly), nor are values that are not tensors passed between pieces: both raise ``NotChunkable``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from onnx import AttributeProto, helper

from worker.engine.runtime import cpu_session, session_options

#: Default weight bytes per piece.
DEFAULT_BUDGET = 256 << 20


class NotChunkable(ValueError):
    """The model cannot be run piece by piece (the message says why)."""


@dataclass(frozen=True)
class _Arg:
    name: str
    type: str
    shape: list | None


def _type_text(dtype: int) -> str:
    name = helper.tensor_dtype_to_np_dtype(dtype).name if dtype else "undefined"
    return "tensor(float)" if name == "float32" else "tensor(double)" if name == "float64" else f"tensor({name})"


def _reads(nodes: Sequence) -> tuple[list[str], list]:
    """What a run of ``nodes`` (in topological order) reads from outside: the values none of them computes, in
    order of first use, and the weights (by name, each once)."""
    produced: set[str] = set()
    inputs: list[str] = []
    constants: dict[str, Any] = {}
    for node in nodes:
        for v in node.inputs:
            if v is None:
                continue
            if v.is_constant:
                constants[v.name] = v
            elif v.name not in produced and v.name not in inputs:
                inputs.append(v.name)
        produced.update(v.name for v in node.outputs)
    return inputs, list(constants.values())


class ChunkedSession:
    def __init__(self, path: str | os.PathLike, budget: int = DEFAULT_BUDGET):
        from worker.engine.ir import load_model
        from worker.engine.limits import Limits

        path = Path(path)
        self.model = load_model(path, external_data_dir=path.parent, limits=Limits())
        self.graph = self.model.graph
        self.budget = budget
        for node in self.graph:
            if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attributes.values()):
                raise NotChunkable(f"node {node.name!r} ({node.op_type}) has a subgraph")
        self.nodes, self.node_protos, self.template = self._protos()
        self._kept: dict[tuple, Any] = {}  # sessions run_nodes keeps, by nodes and outputs
        self.pieces = self._cut()

    # --- the InferenceSession interface ------------------------------------------------------------------
    def get_inputs(self) -> list[_Arg]:
        return [_Arg(v.name, _type_text(v.dtype), None if v.shape is None else list(v.shape))
                for v in self.graph.inputs if not v.is_constant]

    def get_outputs(self) -> list[_Arg]:
        return [_Arg(v.name, _type_text(v.dtype), None if v.shape is None else list(v.shape))
                for v in self.graph.outputs]

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list:
        wanted = list(names) if names is not None else [o.name for o in self.get_outputs()]
        env: dict[str, Any] = dict(feeds)
        for value in self.graph.inputs:  # an initializer that is also an input, and was not fed: its default
            if value.is_initializer and value.name not in env:
                env[value.name] = np.array(value.const)
        for piece in self.pieces:
            outputs = self._run_piece(piece, env)
            env.update(zip(piece.outputs, outputs))
            for name in piece.dead:
                env.pop(name, None)
        for value in self.graph.outputs:  # an output that no node computes
            if value.name not in env and value.is_initializer:
                env[value.name] = np.array(value.const)
        missing = [n for n in wanted if n not in env]
        if missing:
            raise NotChunkable(f"output {missing[0]!r} was not computed")
        return [env[n] for n in wanted]

    def run_nodes(self, indices: Sequence[int], outputs: Sequence[str], feeds: Mapping[str, Any], *,
                  keep: bool = False) -> list:
        """Run the nodes at these positions (of ``self.nodes``, in topological order) as one small session
        on ``feeds`` (every value they read that none of them computes, except weights) and return
        ``outputs``; their weights are fed from the mapped files and dropped afterwards. With ``keep``, the
        session is kept for the next run of the same nodes and outputs (it holds no weights)."""
        inputs, constants = _reads([self.nodes[i] for i in indices])
        dtypes = {v.name: v.dtype for i in indices for v in self.nodes[i].outputs}
        piece = _Piece([self.node_protos[i] for i in indices], inputs, list(outputs), constants,
                       {n: dtypes.get(n, 0) for n in outputs}, [])
        return self._run_piece(piece, feeds, (tuple(indices), tuple(outputs)) if keep else None)

    def _run_piece(self, piece: "_Piece", env: Mapping[str, Any], key: tuple | None = None) -> list:
        session = self._kept.get(key) if key is not None else None
        if session is None:
            session = self._session(piece, env)
            if key is not None:
                self._kept[key] = session
        feeds_in = {name: env[name] for name in piece.inputs}
        for value in piece.constants:  # views of the mapped files: onnxruntime reads them in place
            feeds_in[value.name] = value.const
        outputs = session.run(piece.outputs, feeds_in)
        del session, feeds_in
        for value in piece.constants:
            value.release_pages()
        _trim()
        return outputs

    def _session(self, piece: "_Piece", env: Mapping[str, Any]):
        proto = self._piece_model(piece, env)
        data = proto.SerializeToString()
        del proto
        # no arena: it would keep each piece's buffers after the piece is dropped
        return cpu_session(data, session_options(arena=False))

    # --- cutting -------------------------------------------------------------------------------------
    def _protos(self) -> tuple[list, list, Any]:
        """The nodes in order, their NodeProtos, and the model without nodes, inputs or outputs to build
        pieces in."""
        from worker.engine.ir.serde import _Writer

        nodes = list(self.graph)
        template = _Writer(self.model, value_info=False).model_proto()
        node_protos = list(template.graph.node)
        if len(node_protos) != len(nodes):
            raise NotChunkable("the writer and the graph disagree on the nodes")
        del template.graph.node[:]
        del template.graph.input[:]
        del template.graph.output[:]
        return nodes, node_protos, template

    def _cut(self) -> list["_Piece"]:
        nodes, node_protos = self.nodes, self.node_protos
        groups: list[list[int]] = []
        weights: set[str] = set()
        held = 0
        for i, node in enumerate(nodes):
            mine = {v.name: v.nbytes for v in node.inputs if v is not None and v.is_constant}
            extra = sum(n for name, n in mine.items() if name not in weights)
            if groups and groups[-1] and held + extra > self.budget:
                groups.append([])
                weights, held = set(), 0
                extra = sum(mine.values())
            if not groups:
                groups.append([])
            groups[-1].append(i)
            weights.update(mine)
            held += extra
        last_reader: dict[str, int] = {}
        for g, group in enumerate(groups):
            for i in group:
                for v in nodes[i].inputs:
                    if v is not None and not v.is_constant:
                        last_reader[v.name] = g
        outputs = {v.name for v in self.graph.outputs}
        pieces = []
        for g, group in enumerate(groups):
            inputs, constants = _reads([nodes[i] for i in group])
            outs = [n for i in group for v in nodes[i].outputs for n in [v.name]
                    if n in outputs or last_reader.get(n, -1) > g]
            dead = [n for n in inputs if last_reader.get(n, -1) <= g and n not in outputs]
            types = {v.name: v for i in group for v in nodes[i].outputs}
            for name in outs:
                value = types[name]
                if value.type_proto is not None:
                    raise NotChunkable(f"value {name!r} is not a tensor")
            pieces.append(_Piece([node_protos[i] for i in group], inputs, outs, constants,
                                 {n: types[n].dtype for n in outs}, dead))
        return pieces

    def _piece_model(self, piece: "_Piece", env: Mapping[str, Any]):
        proto = type(self.template)()
        proto.CopyFrom(self.template)
        graph = proto.graph
        graph.node.extend(piece.nodes)
        for name in piece.inputs:
            array = env[name]
            if not isinstance(array, np.ndarray):
                raise NotChunkable(f"value {name!r} is not a tensor")
            graph.input.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(array.dtype), [None] * array.ndim))
        for name in piece.outputs:
            if piece.dtypes[name]:
                graph.output.append(helper.make_tensor_value_info(name, piece.dtypes[name], None))
            else:  # onnxruntime infers it
                graph.output.add().name = name
        for value in piece.constants:  # weights are inputs, fed from the mapping without a copy
            graph.input.append(helper.make_tensor_value_info(value.name, value.dtype, list(value.const.shape)))
        return proto


def _trim() -> None:
    """Give the memory freed with a piece back to the system (glibc keeps freed blocks otherwise)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class _Piece:
    nodes: list
    inputs: list[str]
    outputs: list[str]
    constants: list
    dtypes: dict[str, int]
    dead: list[str]
