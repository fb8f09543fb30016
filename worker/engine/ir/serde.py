"""ONNX file <-> IR. The only module of the IR that imports onnx's protobuf classes.

Loading maps the file and keeps large initializer payloads where they are (see ``wire``): an initializer
becomes a numpy view of the file the first time a pass reads it, and is streamed back from the file on save
if no pass changed it. Saving writes to a temporary file and renames it, so a failed save leaves nothing
behind; a model whose weights do not fit in one protobuf (2 GB) is saved with its large weights in a
``<output>.data`` file next to it. External data of an input is followed only for a trusted local model, and
never outside the model's directory.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto, helper, numpy_helper, version_converter

from worker.engine.errors import ModelError, OptionsError
from worker.engine.limits import Limits, LimitError, printable
from worker.engine.atomic import atomic_path
from worker.engine.ir import functions, wire
from worker.engine.ir.journal import tracked
from worker.engine.ir.graph import Graph, Names
from worker.engine.ir.model import Model
from worker.engine.ir.node import Attr, Node
from worker.engine.ir.tensors import (ExternalData, MappedFile, check_external_data, check_tensor_types,
                                      names_external_data, to_array)
from worker.engine.ir.value import ConstSource, Shape, Value

#: Initializer payloads at least this large stay in the file instead of the parsed protobuf.
MAPPED_MIN_BYTES = 1024
#: Above this total size the writer moves large weights to an external data file.
PROTOBUF_LIMIT = 2**31 - 2**24

_FIXED_WIDTH = {
    TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16,
    TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE,
    TensorProto.UINT32, TensorProto.UINT64, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN,
    TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ,
}
if os.sys.byteorder != "little":  # raw_data is little-endian by the ONNX spec
    raise ImportError("mirserve's zero-copy weight loading needs a little-endian machine")


# --- constant sources ------------------------------------------------------------------------------
class MappedTensor(ConstSource):
    """An initializer whose bytes stay in a mapped file (the model, or trusted external data)."""

    __slots__ = ("buffer", "offset", "nbytes", "dtype", "shape", "file")

    def __init__(self, buffer, offset: int, nbytes: int, dtype: int, shape: tuple[int, ...],
                 file: MappedFile | None = None):
        self.buffer, self.offset, self.nbytes, self.dtype, self.shape = buffer, offset, nbytes, dtype, shape
        self.file = file  # the mapped file with its descriptor, when the writer may copy from it in the kernel

    def array(self) -> np.ndarray:
        np_dtype = helper.tensor_dtype_to_np_dtype(self.dtype)
        count = int(np.prod(self.shape, dtype=np.int64))
        return np.frombuffer(self.buffer, dtype=np_dtype, count=count, offset=self.offset).reshape(self.shape)

    def payload(self) -> memoryview:
        return memoryview(self.buffer)[self.offset:self.offset + self.nbytes]

    def release(self) -> None:
        if self.file is not None:
            self.file.release(self.offset, self.nbytes)

    def take(self, positions: np.ndarray) -> np.ndarray | None:
        if self.file is None:
            return None
        np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(self.dtype))
        data = self.file.read_at(self.offset + np.asarray(positions, dtype=np.int64) * np_dtype.itemsize,
                                 np_dtype.itemsize)
        return None if data is None else np.frombuffer(data, dtype=np_dtype)


class ProtoTensor(ConstSource):
    """A (small, or unusually encoded) initializer kept as its TensorProto until read."""

    __slots__ = ("proto", "dtype", "shape", "nbytes")

    def __init__(self, proto: TensorProto):
        self.proto = proto
        self.dtype = proto.data_type
        self.shape = tuple(int(d) for d in proto.dims)
        self.nbytes = _expected_nbytes(self.dtype, self.shape) or proto.ByteSize()

    def array(self) -> np.ndarray:
        return to_array(self.proto)


def _expected_nbytes(dtype: int, shape: tuple[int, ...]) -> int | None:
    if dtype not in _FIXED_WIDTH:
        return None
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).itemsize
    return int(np.prod(shape, dtype=np.int64)) * itemsize


# --- loading ---------------------------------------------------------------------------------------
def load_model(path: str | os.PathLike, *, external_data_dir: str | os.PathLike | None = None,
               limits: Limits = Limits(), target_opset: int | None = None,
               inline: Callable[[str, str], bool] | None = None) -> Model:
    """Read an ONNX file into the IR. Raises ModelError with a message that says what is wrong and where.

    ``inline(domain, name)`` chooses the model-local functions whose calls are replaced by their bodies
    (``functions.inline_calls``; the model's ``inlined_functions`` counts them). ``target_opset`` then raises
    the model's default-domain opset to it (see ``raise_opset``).

    External data is read only from inside ``external_data_dir``, which the caller passes only for a model
    it trusts (a local file named on the command line); without it any external reference is refused.
    """
    path = Path(path)
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ModelError(f"{path}: is a directory, not an ONNX model file") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise ModelError(f"{path}: empty file, not an ONNX model")
        mapped = MappedFile(os.dup(handle.fileno()), path)
    buffer = mapped.map
    try:
        stripped, spans = wire.strip_initializer_payloads(buffer, MAPPED_MIN_BYTES)
        proto = onnx.ModelProto.FromString(stripped)
    except (wire.WireError, DecodeError, RuntimeError) as exc:
        raise ModelError(f"{path}: not an ONNX model (cannot parse it as a protocol buffer: {exc})") from None
    if not proto.HasField("graph") or not proto.opset_import or proto.ir_version <= 0:
        raise ModelError(f"{path}: not an ONNX model (no graph, IR version or opset import)")
    _check_versions(proto, path)
    _check_limits(proto, limits, path)
    _check_text(proto, path)
    external = ExternalData(external_data_dir) if external_data_dir is not None else None
    check_external_data(proto, external)
    check_tensor_types(proto)
    inlined: dict[functions.FunctionKey, int] = {}
    if inline is not None and proto.functions:
        proto, inlined = functions.inline_calls(proto, inline, path)
    if target_opset is not None:
        proto, spans = raise_opset(proto, spans, target_opset, path)
    model = _Reader(path, mapped, spans, external, limits).model(proto)
    model.inlined_functions = inlined
    model.external_data_bytes = external.mapped_bytes if external is not None else 0
    model.mapped_files = [mapped, *(external.files if external is not None else ())]
    _check_reshapes(model.graph, path)
    return model


def _check_text(proto: onnx.ModelProto, path: Path) -> None:
    """Every text field (names, op types, domains, doc strings, metadata) is UTF-8, as ONNX requires: protobuf
    hands out the bytes of one that is not, which would fail far from here (or reach a terminal)."""
    string = FieldDescriptor.TYPE_STRING
    stack: list[tuple[str, object]] = [("model", proto)]
    while stack:
        where, message = stack.pop()
        for field, value in message.ListFields():
            items = value if field.is_repeated else [value]
            if field.type == string:
                for item in items:
                    if isinstance(item, bytes):
                        raise ModelError(f"{path}: {where}.{field.name} is not UTF-8 text ({item[:24]!r}), "
                                         f"which ONNX requires of every name")
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                stack.extend((f"{where}.{field.name}" + (f"[{i}]" if field.is_repeated else ""), item)
                             for i, item in enumerate(items))


def _check_versions(proto: onnx.ModelProto, path: Path) -> None:
    """The IR version and the standard domains' opset versions must be ones onnx defines."""
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelError(f"{path}: IR version {proto.ir_version} is newer than any this onnx knows "
                         f"(up to {onnx.IR_VERSION})")
    # (release, IR version, ai.onnx, ai.onnx.ml, ai.onnx.training) of the newest release this onnx knows
    newest = onnx.helper.VERSION_TABLE[-1]
    known = {"": max(newest[2], onnx.defs.onnx_opset_version()), "ai.onnx": max(newest[2],
             onnx.defs.onnx_opset_version()), "ai.onnx.ml": newest[3]}
    seen = set()
    for entry in proto.opset_import:
        name = entry.domain or "the default domain"
        if entry.domain in seen:
            raise ModelError(f"{path}: the opset of {name} is imported twice")
        seen.add(entry.domain)
        if entry.version < 1:
            raise ModelError(f"{path}: opset version {entry.version} of {name} is not a version")
        if entry.domain in known and entry.version > known[entry.domain]:
            raise ModelError(f"{path}: opset version {entry.version} of {name} is not one onnx defines "
                             f"(1 to {known[entry.domain]})")


def _check_reshapes(graph: Graph, path: Path) -> None:
    """A constant Reshape shape may hold -1 once and no other negative number."""
    for body in graph.all_graphs():
        for node in body.nodes_of_type("Reshape"):
            shape = node.input(1)
            data = shape.constant_value() if shape is not None else None
            if data is None:
                continue
            dims = [int(d) for d in np.reshape(data, -1)]
            if any(d < -1 for d in dims) or dims.count(-1) > 1:
                raise ModelError(f"{path}: node {printable(node.name)} (Reshape) asks for shape {dims}: only one "
                                 f"dimension may be -1 and none may be below it")


def raise_opset(proto: onnx.ModelProto, spans: dict[int, wire.RawSpan], target: int,
                path: Path) -> tuple[onnx.ModelProto, dict[int, wire.RawSpan]]:
    """The model converted to default-domain opset ``target`` by onnx's version converter, which rewrites the
    ops whose signature changed (Split's split attribute to an input, ...), so fusions into newer ops (Gelu 20,
    RMSNormalization 23, ...) may apply; the IR version is raised to the one the opset needs.

    It works on the stripped protobuf: the converter keeps initializers by name, so the payload spans are
    carried over by name. A model already at ``target`` is unchanged; a lower target is refused (opsets are
    raised, never lowered) and so is a model the converter cannot convert, saying why.
    """
    current = next((e.version for e in proto.opset_import if e.domain in ("", "ai.onnx")), None)
    if current is None:
        raise ModelError(f"{path}: the model imports no default-domain opset, so there is none to raise")
    if target < current:
        raise OptionsError(f"target_opset {target} is below the model's opset {current}: mirserve raises opsets, "
                           f"never lowers them", field="target_opset")
    if target == current:
        return proto, spans
    names = {index: tensor.name for index, tensor in enumerate(proto.graph.initializer)}
    try:
        converted = version_converter.convert_version(proto, target)
    except Exception as exc:  # the converter raises bare RuntimeErrors and C++ errors with the op named
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: onnx's version converter cannot raise the opset from {current} to {target}: "
                         f"{message}") from None
    by_name = {names[index]: span for index, span in spans.items()}
    moved = {index: by_name[tensor.name] for index, tensor in enumerate(converted.graph.initializer)
             if tensor.name in by_name and not tensor.raw_data}
    if len(moved) != len(spans):
        raise ModelError(f"{path}: onnx's version converter dropped or rewrote initializers while raising the "
                         f"opset from {current} to {target}")
    needed = helper.find_min_ir_version_for(list(converted.opset_import), ignore_unknown=True)
    converted.ir_version = max(converted.ir_version, needed)
    return converted, moved


def _check_limits(proto: onnx.ModelProto, limits: Limits, path: Path) -> None:
    """Counts, nesting and declared dims, on the parsed protobuf before any IR is built; the nodes counted with
    every call of a model-local function as the nodes it expands to."""
    nodes = values = 0
    stack = [(proto.graph, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > limits.max_depth:
            raise LimitError(f"{path}: subgraphs nested deeper than {limits.max_depth} levels (limit max_depth; "
                             f"raise it with --limit max_depth=N)")
        nodes += len(current.node)
        values += len(current.input) + len(current.initializer) + sum(len(n.output) for n in current.node)
        if nodes > limits.max_nodes:
            raise LimitError(f"{path}: more than {limits.max_nodes:,} nodes (limit max_nodes; raise it with "
                             f"--limit max_nodes=N)")
        if values > limits.max_values:
            raise LimitError(f"{path}: more than {limits.max_values:,} values (limit max_values; raise it with "
                             f"--limit max_values=N)")
        for node in current.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append((attr.g, depth + 1))
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend((g, depth + 1) for g in attr.graphs)
        for info in list(current.input) + list(current.output) + list(current.value_info):
            for dim in info.type.tensor_type.shape.dim:
                if dim.HasField("dim_value") and dim.dim_value > limits.max_dim:  # -1 is how some say "any"
                    raise LimitError(f"{path}: value {printable(info.name)} declares dimension {dim.dim_value}, "
                                     f"above the limit of {limits.max_dim} (limit max_dim)")
        for tensor in current.initializer:
            if any(not 0 <= d <= limits.max_dim for d in tensor.dims):
                raise LimitError(f"{path}: initializer {printable(tensor.name)} has dimensions "
                                 f"{list(tensor.dims)}, each must be from 0 to {limits.max_dim} (limit max_dim)")
    if proto.functions:
        functions.check_calls(proto, path)
        expanded = functions.expanded_nodes(proto, path)
        if expanded > limits.max_nodes:
            raise LimitError(f"{path}: its calls of model-local functions expand to {expanded:,} nodes, more than "
                             f"{limits.max_nodes:,} (limit max_nodes; raise it with --limit max_nodes=N)")


class _Reader:
    def __init__(self, path: Path, mapped: MappedFile, spans: dict[int, wire.RawSpan],
                 external: ExternalData | None, limits: Limits):
        self.path, self.mapped, self.spans, self.external, self.limits = path, mapped, spans, external, limits
        self.buffer = mapped.map
        self.names = Names()

    def model(self, proto: onnx.ModelProto) -> Model:
        graph = Graph(proto.graph.name, names=self.names)
        self.fill_graph(graph, proto.graph, top_level=True)
        extra = {}
        if proto.training_info:
            extra["training_info"] = list(proto.training_info)
        if proto.configuration:
            extra["configuration"] = list(proto.configuration)
        opsets: dict[str, int] = {}
        for entry in proto.opset_import:
            opsets["" if entry.domain == "ai.onnx" else entry.domain] = entry.version
        return Model(graph=graph, ir_version=proto.ir_version, opset_imports=opsets,
                     producer_name=proto.producer_name, producer_version=proto.producer_version,
                     domain=proto.domain, model_version=proto.model_version, doc_string=proto.doc_string,
                     metadata={p.key: p.value for p in proto.metadata_props},
                     functions=list(proto.functions), extra=extra)

    def fill_graph(self, graph: Graph, proto: onnx.GraphProto, top_level: bool = False) -> None:
        graph.doc_string = proto.doc_string
        graph.metadata = tracked({p.key: p.value for p in proto.metadata_props})
        graph.sparse_initializers = list(proto.sparse_initializer)
        graph.quantization_annotation = list(proto.quantization_annotation)
        for index, tensor in enumerate(proto.initializer):
            source = self.const_source(tensor, self.spans.get(index) if top_level else None)
            value = graph.add_initializer(tensor.name, source, exact_name=True)
            value.doc_string = tensor.doc_string
        named = set()
        for info in proto.input:
            if info.name in named:
                raise ModelError(f"{self.path}: graph {printable(proto.name)} declares input {printable(info.name)} "
                                 f"twice")
            named.add(info.name)
            value = graph.value(info.name)
            if value is None:
                value = Value(info.name)
                graph.add_input(value)
            else:
                value._is_input = True
                graph.inputs.append(value)
            self.apply_type(value, info)
        self.read_nodes(graph, proto)
        for info in proto.value_info:
            value = graph.lookup(info.name)
            if value is not None and value.graph is graph:
                self.apply_type(value, info)
        outputs = []
        for info in proto.output:
            value = graph.lookup(info.name)
            if value is None:
                raise ModelError(f"{self.path}: graph {proto.name!r} output {info.name!r} is not produced by "
                                 f"any node, input or initializer")
            self.apply_type(value, info)
            outputs.append(value)
        graph.set_outputs(outputs)
        graph.toposort()

    def read_nodes(self, graph: Graph, proto: onnx.GraphProto) -> None:
        pending = []
        for node_proto in proto.node:
            outputs = []
            for name in node_proto.output:
                if not name:  # an omitted optional output still needs a slot
                    name = graph.names.fresh("unused_output", graph.names.values)
                if graph.lookup(name) is not None:
                    raise ModelError(f"{self.path}: value {name!r} is produced twice (again by node "
                                     f"{node_proto.name!r}, {node_proto.op_type})")
                outputs.append(Value(name))
            node = Node(node_proto.op_type, (), outputs, domain=_domain(node_proto.domain), name=node_proto.name)
            node.doc_string, node.overload = node_proto.doc_string, node_proto.overload
            node.metadata = tracked({p.key: p.value for p in node_proto.metadata_props})
            graph.append(node)
            pending.append((node, node_proto))
        for node, node_proto in pending:
            for name in node_proto.input:
                value = graph.lookup(name) if name else None
                if name and value is None:
                    raise ModelError(f"{self.path}: node {node_proto.name!r} ({node_proto.op_type}) reads "
                                     f"{name!r}, which no node, input or initializer defines")
                if value is not None and value.producer is node:
                    raise ModelError(f"{self.path}: node {printable(node_proto.name)} ({node_proto.op_type}) reads "
                                     f"its own output {printable(name)}")
                node._append_input(value)
            for attr in node_proto.attribute:
                node.attributes[attr.name] = self.attribute(node, attr)
            graph.note_bodies(node)

    def attribute(self, node: Node, proto: AttributeProto) -> Attr:
        if proto.type == AttributeProto.GRAPH and not proto.ref_attr_name:
            return Attr(proto.name, proto.type, self.body(node, proto.g))
        if proto.type == AttributeProto.GRAPHS and not proto.ref_attr_name:
            return Attr(proto.name, proto.type, [self.body(node, g) for g in proto.graphs])
        return Attr(proto.name, proto.type, proto=proto)

    def body(self, node: Node, proto: onnx.GraphProto) -> Graph:
        body = Graph(proto.name, names=self.names)
        body.parent = node
        self.fill_graph(body, proto)
        return body

    def const_source(self, tensor: TensorProto, span: wire.RawSpan | None) -> ConstSource:
        shape = tuple(int(d) for d in tensor.dims)
        if names_external_data(tensor):  # check_external_data refused it unless the model is trusted
            where, expected = f"initializer {tensor.name!r}", _expected_nbytes(tensor.data_type, shape)
            if expected is None:
                raise ModelError(f"{where}: external data is supported for fixed-width types only, not "
                                 f"{helper.tensor_dtype_to_string(tensor.data_type)}")
            mapped, offset, length = self.external.source(tensor, where, expected)
            return MappedTensor(mapped.map, offset, length, tensor.data_type, shape, mapped)
        if span is None:
            return ProtoTensor(tensor)
        expected = _expected_nbytes(tensor.data_type, shape)
        if expected is None:  # packed or string types: hand the payload back to protobuf
            full = TensorProto()
            full.CopyFrom(tensor)
            full.raw_data = bytes(self.buffer[span.offset:span.offset + span.length])
            return ProtoTensor(full)
        if expected != span.length:
            raise ModelError(f"{self.path}: initializer {tensor.name!r} has {span.length} bytes of data, "
                             f"shape {list(shape)} needs {expected}")
        return MappedTensor(self.buffer, span.offset, span.length, tensor.data_type, shape, self.mapped)

    @staticmethod
    def apply_type(value: Value, info: onnx.ValueInfoProto) -> None:
        if info.doc_string:
            value.doc_string = info.doc_string
        for prop in info.metadata_props:
            value.metadata[prop.key] = prop.value
        if not info.HasField("type"):
            return
        dtype, shape, other = type_from_proto(info.type)
        if other is not None:
            value.type_proto = other
            return
        if dtype:
            value.dtype = dtype
        if shape is not None:
            value.shape = shape


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def type_from_proto(type_proto: onnx.TypeProto) -> tuple[int, Shape | None, onnx.TypeProto | None]:
    """(dtype, shape, None) for a tensor type; (0, None, the proto) for sequences, maps and optionals."""
    kind = type_proto.WhichOneof("value")
    if kind is None:
        return 0, None, None  # declared without a type: unknown
    if type_proto.HasField("tensor_type"):
        tensor = type_proto.tensor_type
    elif type_proto.HasField("sparse_tensor_type"):
        tensor = type_proto.sparse_tensor_type
    else:
        return 0, None, type_proto
    shape = None
    if tensor.HasField("shape"):
        # Some exporters write -1 for a dynamic dimension: read it as unknown.
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
                      for d in tensor.shape.dim)
    return tensor.elem_type, shape, None


# --- saving ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SaveInfo:
    path: Path
    bytes: int
    external_data: Path | None


def save_model(model: Model, path: str | os.PathLike, *, protobuf_limit: int = PROTOBUF_LIMIT,
               value_info: bool = True, check: Callable[[Path], None] | None = None,
               external_data: bool = False, edit: Callable[[onnx.ModelProto], None] | None = None) -> SaveInfo:
    """Write the model to ``path`` atomically, with external data beside it when it is too big for protobuf
    or ``external_data`` asks for it.

    ``check`` is called with the complete temporary file before it is renamed to ``path``; if it raises,
    nothing is left behind (the way a model that fails verification never reaches its output path).
    ``edit`` may change the ModelProto as written, without its top-level initializers (verification's form
    of a candidate: ``numeric.store_fp16_values``).
    """
    path = Path(path)
    writer = _Writer(model, value_info)
    head, tail, chunks = writer.layout(edit)
    total = len(head) + len(tail) + sum(c.size for c in chunks)
    data_path = None
    if total > protobuf_limit or (external_data and any(
            c.payload is not None and len(c.payload) >= MAPPED_MIN_BYTES for c in chunks)):
        data_path = path.with_name(path.name + ".data")
        chunks = _to_external(chunks, data_path.name)
    if data_path is not None:  # the model names its data file, so the data is published first
        with atomic_path(data_path) as tmp_data, open(tmp_data, "wb") as data_file:
            for chunk in chunks:
                chunk.write_external(data_file)
    try:
        with atomic_path(path) as tmp_model:
            with open(tmp_model, "wb") as out:
                size = _write_model(out, head, tail, chunks)
            if check is not None:
                check(tmp_model)
    except BaseException:
        if data_path is not None:
            data_path.unlink(missing_ok=True)
        raise
    return SaveInfo(path, size, data_path)


#: Initializers up to this size keep their contents in a model written for shape inference.
INFERENCE_BYTES = 1024


def model_to_proto(model: Model, *, with_weights: bool = True, value_info: bool = True) -> onnx.ModelProto:
    """The whole model as one ModelProto (in memory: for small models, checks and tests).

    Without weights, initializers over ``INFERENCE_BYTES`` are declared by type only: shape inference needs
    the contents of the small ones (a Reshape's target shape), the types of the rest.
    """
    writer = _Writer(model, value_info)
    proto = writer.model_proto()
    declared = {info.name for info in proto.graph.input}
    for chunk in writer.initializer_chunks():
        if chunk.full is not None:
            proto.graph.initializer.append(chunk.full)
        elif with_weights or len(chunk.payload) <= INFERENCE_BYTES:
            tensor = proto.graph.initializer.add()
            tensor.CopyFrom(chunk.header)
            tensor.raw_data = bytes(chunk.payload)
        elif chunk.header.name not in declared:
            proto.graph.input.append(helper.make_tensor_value_info(
                chunk.header.name, chunk.header.data_type, list(chunk.header.dims)))
    return proto


class _Chunk:
    """One top-level initializer as written: a small header and, for raw tensors, a payload to stream."""

    def __init__(self, header: TensorProto, payload, full: TensorProto | None = None):
        self.header = header  # TensorProto without raw data
        self.payload = payload  # buffer of raw bytes, or None when ``full`` carries everything
        self.full = full
        self.source: tuple[MappedFile, int] | None = None  # (file, offset) the payload can be copied from
        self.external: TensorProto | None = None
        self._offset = 0
        self._encoded_header = (full or header).SerializeToString()

    @property
    def size(self) -> int:
        inner = self._inner_size()
        return len(wire.len_field_header(wire.GRAPH_INITIALIZER, inner)) + inner

    def _inner_size(self) -> int:
        if self.external is not None:
            return len(self._encoded_header)
        if self.payload is None:
            return len(self._encoded_header)
        n = len(self.payload)
        return len(self._encoded_header) + len(wire.len_field_header(wire.TENSOR_RAW_DATA, n)) + n

    def write(self, out: BinaryIO) -> None:
        out.write(wire.len_field_header(wire.GRAPH_INITIALIZER, self._inner_size()))
        out.write(self._encoded_header)
        if self.external is None and self.payload is not None:
            out.write(wire.len_field_header(wire.TENSOR_RAW_DATA, len(self.payload)))
            self._write_payload(out)

    def write_external(self, data_file: BinaryIO) -> None:
        if self.external is not None:
            data_file.seek(self._offset)
            self._write_payload(data_file)

    def _write_payload(self, out: BinaryIO) -> None:
        if self.source is not None:
            mapped, offset = self.source
            if _copy_range(mapped, offset, len(self.payload), out):
                return
            out.write(self.payload)
            mapped.release(offset, len(self.payload))  # read once: out of the resident set again
            return
        _write_payload(out, self.payload)


class ArrayPayload:
    """The raw bytes of an in-memory initializer, produced block by block while they are written.

    A folded weight is often a broadcast view (a ConstantOfShape fill, an Expand of a scalar) that takes no
    memory; making it one contiguous buffer would hold the whole tensor at once, and building every chunk
    before writing would hold all of them. So the bytes are made only when written, at most
    ``BLOCK_BYTES`` at a time, and a contiguous array is written straight from its memory.
    """

    BLOCK_BYTES = 16 << 20

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __len__(self) -> int:
        return int(self.array.nbytes)

    def __bytes__(self) -> bytes:
        return b"".join(bytes(block) for block in self.blocks())

    def blocks(self) -> Iterable[np.ndarray]:
        """The payload as consecutive uint8 arrays of at most BLOCK_BYTES (or one row, when larger)."""
        array = self.array
        if array.flags.c_contiguous:
            yield _as_bytes(array)
        elif array.size and all(stride == 0 for stride in array.strides):
            yield from _uniform_blocks(array, self.BLOCK_BYTES)
        else:
            yield from _strided_blocks(array, self.BLOCK_BYTES)


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _uniform_blocks(array: np.ndarray, limit: int) -> Iterable[np.ndarray]:
    """One value repeated: one block of it, written as many times as needed."""
    count = array.size
    per_block = max(1, min(count, limit // array.itemsize))
    block = _as_bytes(np.full(per_block, array[(0,) * array.ndim], dtype=array.dtype))
    for _ in range(count // per_block):
        yield block
    if count % per_block:
        yield block[:(count % per_block) * array.itemsize]


def _strided_blocks(array: np.ndarray, limit: int) -> Iterable[np.ndarray]:
    if array.ndim == 0 or array.nbytes <= limit:
        yield _as_bytes(array)
        return
    row = array[0].nbytes
    if row > limit:
        for i in range(array.shape[0]):
            yield from _strided_blocks(array[i], limit)
        return
    step = max(1, limit // max(1, row))
    for start in range(0, array.shape[0], step):
        yield _as_bytes(array[start:start + step])


#: Set to False to write mapped payloads through the mapping (tests compare both ways).
COPY_FILE_RANGE = hasattr(os, "copy_file_range")


def _copy_range(mapped: MappedFile, offset: int, length: int, out: BinaryIO) -> bool:
    """Copy ``length`` bytes at ``offset`` of ``mapped`` to ``out`` at its position, in the kernel; False when
    the kernel cannot (another file system, an old kernel), before anything was written."""
    if not COPY_FILE_RANGE or mapped.fd < 0 or length == 0:
        return False
    try:
        out_fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stream
        return False
    out.flush()
    position = out.tell()
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(mapped.fd, out_fd, length - done, offset + done, position + done)
            if n == 0:
                raise OSError("the source ended early")
            done += n
    except OSError:
        if done:
            raise
        return False
    out.seek(position + length)
    return True


def _write_payload(out: BinaryIO, payload) -> None:
    if isinstance(payload, ArrayPayload):
        for block in payload.blocks():
            out.write(block)
    else:
        out.write(payload)


def _to_external(chunks: list[_Chunk], location: str) -> list[_Chunk]:
    offset = 0
    for chunk in chunks:
        if chunk.payload is None or len(chunk.payload) < MAPPED_MIN_BYTES:
            continue
        offset = (offset + 4095) // 4096 * 4096  # page-aligned, so readers can map each tensor
        tensor = TensorProto()
        tensor.CopyFrom(chunk.header)
        tensor.data_location = TensorProto.EXTERNAL
        for key, val in (("location", location), ("offset", str(offset)), ("length", str(len(chunk.payload)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, val
        chunk.external = tensor
        chunk._offset = offset
        chunk._encoded_header = tensor.SerializeToString()
        offset += len(chunk.payload)
    return chunks


def _write_model(out: BinaryIO, head: bytes, graph_head: bytes, chunks: list[_Chunk]) -> int:
    graph_size = len(graph_head) + sum(c.size for c in chunks)
    out.write(head)
    header = wire.len_field_header(wire.MODEL_GRAPH, graph_size)
    out.write(header)
    out.write(graph_head)
    for chunk in chunks:
        chunk.write(out)
    return len(head) + len(header) + graph_size


class _Writer:
    def __init__(self, model: Model, value_info: bool):
        from worker.engine.mirserve_domain import ops as domain

        self.model = model
        self.value_info = value_info
        self.functions = domain.functions_for(model)
        self.ir = self._ir_version()

    def layout(self, edit: Callable[[onnx.ModelProto], None] | None = None) -> tuple[bytes, bytes, list[_Chunk]]:
        proto = self.model_proto()
        if edit is not None:
            edit(proto)
        graph = onnx.GraphProto()
        graph.CopyFrom(proto.graph)
        proto.ClearField("graph")
        return proto.SerializeToString(), graph.SerializeToString(), list(self.initializer_chunks())

    def model_proto(self) -> onnx.ModelProto:
        """The ModelProto without top-level initializers (those come from ``initializer_chunks``)."""
        model = self.model
        proto = onnx.ModelProto()
        proto.ir_version = self.ir
        opsets = dict(model.opset_imports)
        for function in self.functions:
            opsets.setdefault(function.domain, 1)
        for name, version in opsets.items():
            proto.opset_import.add(domain=name, version=version)
        proto.producer_name, proto.producer_version = model.producer_name, model.producer_version
        proto.domain, proto.model_version, proto.doc_string = model.domain, model.model_version, model.doc_string
        _set_props(proto.metadata_props, model.metadata)
        proto.graph.CopyFrom(self.graph_proto(model.graph, top_level=True))
        proto.functions.extend(model.functions)
        proto.functions.extend(self.functions)
        for name, items in model.extra.items():
            getattr(proto, name).extend(items)
        return proto

    def _ir_version(self) -> int:
        version = self.model.ir_version
        if any(node.metadata for node in self.model.graph.all_nodes()):
            version = max(version, 10)  # node metadata_props exist from IR 10
        if self.functions or self.model.functions:
            version = max(version, 8)  # model-local functions exist from IR 8
        return version

    def graph_proto(self, graph: Graph, top_level: bool = False) -> onnx.GraphProto:
        proto = onnx.GraphProto(name=graph.name, doc_string=graph.doc_string)
        _set_props(proto.metadata_props, graph.metadata)
        for node in graph:
            proto.node.append(self.node_proto(node))
        declared = set()
        for value in graph.inputs:
            proto.input.append(value_info_proto(value))
            declared.add(value.name)
        if self.ir < 4:  # before IR 4 every initializer must also be a graph input
            for value in graph.initializers.values():
                if value.name not in declared:
                    proto.input.append(value_info_proto(value))
        for value in graph.outputs:
            proto.output.append(value_info_proto(value))
        if not top_level:
            for value in graph.initializers.values():
                proto.initializer.append(tensor_proto(value))
        if self.value_info:
            outputs = {v.name for v in graph.outputs}
            for node in graph:
                for value in node.outputs:
                    if value.name not in outputs and (value.dtype or value.type_proto is not None):
                        proto.value_info.append(value_info_proto(value))
        proto.sparse_initializer.extend(graph.sparse_initializers)
        proto.quantization_annotation.extend(graph.quantization_annotation)
        return proto

    def node_proto(self, node: Node) -> onnx.NodeProto:
        proto = onnx.NodeProto(op_type=node.op_type, domain=node.domain, name=node.name,
                               doc_string=node.doc_string, overload=node.overload)
        proto.input.extend(v.name if v is not None else "" for v in node.inputs)
        proto.output.extend(v.name if v.uses or v.is_graph_output or not _unused_name(v) else ""
                            for v in node.outputs)
        while proto.output and proto.output[-1] == "":
            proto.output.pop()
        for attr in node.attributes.values():
            proto.attribute.append(self.attribute_proto(attr))
        _set_props(proto.metadata_props, node.metadata)
        return proto

    def attribute_proto(self, attr: Attr) -> AttributeProto:
        if attr.proto is None and attr.type == AttributeProto.GRAPH:
            return helper.make_attribute(attr.name, self.graph_proto(attr.value))
        if attr.proto is None and attr.type == AttributeProto.GRAPHS:
            return helper.make_attribute(attr.name, [self.graph_proto(g) for g in attr.value])
        return encode_attribute(attr)

    def initializer_chunks(self) -> Iterable[_Chunk]:
        for value in self.model.graph.initializers.values():
            yield initializer_chunk(value)


def encode_attribute(attr: Attr) -> AttributeProto:
    """An attribute as AttributeProto (graph attributes need the writer, see ``_Writer.attribute_proto``)."""
    if attr.proto is not None:
        return attr.proto
    if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        raise ValueError(f"graph attribute {attr.name!r} needs the model writer")
    if attr.type == AttributeProto.TENSOR:
        return helper.make_attribute(attr.name, numpy_helper.from_array(np.asarray(attr.value)))
    value = attr.value
    if isinstance(value, list) and not value:
        return helper.make_attribute(attr.name, [], attr_type=attr.type)
    return helper.make_attribute(attr.name, value, attr_type=attr.type)


def _unused_name(value: Value) -> bool:
    return value.name.startswith("unused_output")


def _set_props(target, props: dict[str, str]) -> None:
    for key, val in props.items():
        target.add(key=key, value=val)


def value_info_proto(value: Value) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto(name=value.name, doc_string=value.doc_string)
    if value.type_proto is not None:
        info.type.CopyFrom(value.type_proto)
    elif value.dtype:
        info.type.tensor_type.elem_type = value.dtype
        if value.shape is not None:
            shape = info.type.tensor_type.shape
            shape.SetInParent()
            for dim in value.shape:
                entry = shape.dim.add()
                if isinstance(dim, int):
                    entry.dim_value = dim
                elif isinstance(dim, str):
                    entry.dim_param = dim
    _set_props(info.metadata_props, value.metadata)
    return info


def initializer_chunk(value: Value) -> _Chunk:
    source = value.const_source
    if isinstance(source, MappedTensor):
        header = TensorProto(name=value.name, data_type=source.dtype, dims=source.shape,
                             doc_string=value.doc_string)
        chunk = _Chunk(header, source.payload())
        if source.file is not None:
            chunk.source = (source.file, source.offset)
        return chunk
    if isinstance(source, ProtoTensor):
        full = source.proto
        if full.name != value.name or full.doc_string != value.doc_string:
            full = TensorProto()
            full.CopyFrom(source.proto)
            full.name, full.doc_string = value.name, value.doc_string
        return _Chunk(full, None, full)
    array = value.const
    dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
    header = TensorProto(name=value.name, data_type=dtype, dims=array.shape, doc_string=value.doc_string)
    if dtype in _FIXED_WIDTH:
        return _Chunk(header, ArrayPayload(array))  # bytes made while writing, a block at a time
    full = numpy_helper.from_array(array, value.name)
    full.doc_string = value.doc_string
    return _Chunk(full, None, full)


def tensor_proto(value: Value) -> TensorProto:
    chunk = initializer_chunk(value)
    if chunk.full is not None:
        return chunk.full
    tensor = TensorProto()
    tensor.CopyFrom(chunk.header)
    tensor.raw_data = bytes(chunk.payload)
    return tensor
