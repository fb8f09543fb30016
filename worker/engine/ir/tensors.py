"""The one way from a model to a tensor's bytes: never a file that the caller did not vouch for.

ONNX lets any tensor keep its bytes in an external file (``data_location = EXTERNAL`` with a ``location``
relative to the model), and onnx's own decoder resolves that name against the working directory when it is
given no base directory. An uploaded model could thus make the engine read any file the process can read
(CVE-2022-25882 and CVE-2024-27318 are the same class). So:

- ``check_external_data`` runs once at load, on the parsed model, over every tensor onnx can decode:
  initializers and sparse initializers of every graph (bodies included), tensor and sparse-tensor attributes
  of every node (bodies and model-local functions included) and training graphs. Without a trusted base
  directory any external reference is refused with a sentence that names the tensor; with one, the reference
  must name a regular file inside that directory (no absolute path, no ``..``, no link on the way), and the
  offset and length must be integers within the file. Attribute and sparse tensors are then read in (they are
  small); initializers are mapped by the loader through the same ``ExternalData``.
- ``to_array`` is the only decoder the engine calls. It refuses a tensor that still names external data, so
  no later code path can reach a file either.
"""
from __future__ import annotations

import mmap
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Iterator

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from worker.engine.errors import ModelError

_INTEGER = re.compile(r"[0-9]{1,19}")


def names_external_data(tensor: TensorProto) -> bool:
    """True when a runtime could go to a file for this tensor's bytes."""
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


def to_array(tensor: TensorProto) -> np.ndarray:
    """Decode a tensor held in the model itself; a tensor that names external data is an error."""
    if names_external_data(tensor):
        raise ModelError(f"tensor {tensor.name!r} keeps its data in an external file, which is only read "
                         f"from a trusted local model at load")
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelError(f"tensor {tensor.name!r} cannot be decoded: {exc}") from None


class MappedFile:
    """A file mapped read-only, with a descriptor kept open so that writers can copy ranges of it in the kernel
    (``copy_file_range``) instead of reading them through the mapping, which would count every page copied in
    the process's resident set."""

    __slots__ = ("map", "fd", "path", "_random_fd", "__weakref__")

    def __init__(self, fd: int, path: Path):
        """Maps ``fd`` and takes it over (it is closed with this object)."""
        self.fd, self.path = fd, path
        self._random_fd = -1
        try:
            self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise

    def __len__(self) -> int:
        return len(self.map)

    def __del__(self) -> None:
        for name in ("fd", "_random_fd"):
            fd = getattr(self, name, -1)
            setattr(self, name, -1)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def read_at(self, offsets, size: int) -> bytes | None:
        """``size`` bytes at each offset, concatenated, read without the mapping and without readahead (a
        fault on the mapping reads and maps megabytes around the element); None when the file cannot be
        read that way."""
        if self._random_fd < 0:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return None
            if os.fstat(fd).st_ino != os.fstat(self.fd).st_ino:  # replaced since it was mapped
                os.close(fd)
                return None
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            self._random_fd = fd
        try:
            parts = [os.pread(self._random_fd, size, int(offset)) for offset in offsets]
        except OSError:
            return None
        if any(len(part) != size for part in parts):
            return None
        return b"".join(parts)

    def release(self, offset: int, length: int) -> None:
        """Drop the process's mapping of these bytes' pages (the page cache keeps them; reading them again
        maps them again), so a payload read once through the mapping does not stay in the resident set."""
        start = offset // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(len(self.map), offset + length)
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self.map.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass


class ExternalData:
    """External data files of a trusted model: regular files inside ``base``, each mapped once."""

    def __init__(self, base: str | os.PathLike):
        self.base = Path(base).resolve()
        self._maps: dict[Path, MappedFile] = {}

    @property
    def files(self) -> list[MappedFile]:
        return list(self._maps.values())

    @property
    def mapped_bytes(self) -> int:
        """Bytes of the external data files mapped so far (every one the model names, after loading)."""
        return sum(len(f) for f in self._maps.values())

    def buffer(self, tensor: TensorProto, where: str, nbytes: int | None) -> tuple[mmap.mmap, int, int]:
        """The mapped file, offset and length of ``tensor``'s bytes; ``nbytes`` is what its shape needs."""
        mapped, offset, length = self.source(tensor, where, nbytes)
        return mapped.map, offset, length

    def source(self, tensor: TensorProto, where: str, nbytes: int | None) -> tuple[MappedFile, int, int]:
        """The mapped file (with its descriptor), offset and length of ``tensor``'s bytes."""
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        path = self._resolve(location, where)
        mapped = self._map(path, location, where)
        offset = _integer(info.get("offset", "0"), "offset", where)
        if offset > len(mapped):
            raise ModelError(f"{where}: external data {location!r} holds {len(mapped)} bytes, fewer than its "
                             f"offset {offset}")
        length = _integer(info["length"], "length", where) if "length" in info else (
            nbytes if nbytes is not None else len(mapped) - offset)
        if nbytes is not None and length != nbytes:
            raise ModelError(f"{where}: external data {location!r} declares {length} bytes, its type and "
                             f"shape need {nbytes}")
        if offset + length > len(mapped):
            raise ModelError(f"{where}: external data {location!r} holds {len(mapped)} bytes, fewer than "
                             f"offset {offset} + length {length}")
        return mapped, offset, length

    def read_into(self, tensor: TensorProto, where: str) -> None:
        """Replace the external reference of a (small) tensor by its bytes."""
        mapped, offset, length = self.buffer(tensor, where, _fixed_nbytes(tensor))
        tensor.raw_data = bytes(mapped[offset:offset + length])
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT

    def _resolve(self, location: str, where: str) -> Path:
        if not location or "\x00" in location or "\\" in location:
            raise ModelError(f"{where}: external data location {location!r} is not a plain relative file name")
        relative = PurePosixPath(location)
        if not relative.parts or relative.is_absolute() or any(part in ("..", "") for part in relative.parts) or re.match(
                r"^[A-Za-z]:", location):
            raise ModelError(f"{where}: external data location {location!r} leaves the model's directory")
        path = self.base
        for part in relative.parts:
            path = path / part
            try:
                info = os.lstat(path)
            except OSError as exc:
                raise ModelError(f"{where}: cannot read external data {location!r} "
                                 f"({exc.strerror or exc})") from None
            if stat.S_ISLNK(info.st_mode):
                raise ModelError(f"{where}: external data location {location!r} goes through a link")
        if not stat.S_ISREG(info.st_mode):
            raise ModelError(f"{where}: external data location {location!r} is not a regular file")
        return path

    def _map(self, path: Path, location: str, where: str) -> MappedFile:
        if path not in self._maps:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise ModelError(f"{where}: cannot read external data {location!r} "
                                 f"({exc.strerror or exc})") from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ModelError(f"{where}: external data location {location!r} is not a regular file")
                if os.fstat(fd).st_size == 0:
                    raise ModelError(f"{where}: external data file {location!r} is empty")
            except BaseException:
                os.close(fd)
                raise
            self._maps[path] = MappedFile(fd, path)
        return self._maps[path]


def _integer(text: str, key: str, where: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise ModelError(f"{where}: external data {key} {text!r} is not a non-negative integer")
    return int(text)


def _fixed_nbytes(tensor: TensorProto) -> int | None:
    """Bytes a fixed-width tensor of this type and shape holds (None for strings and packed types)."""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED) or tensor.data_type in _PACKED:
        return None
    return int(np.prod([int(d) for d in tensor.dims], dtype=np.int64)) * itemsize


_PACKED = {getattr(TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, name)}


# --- every tensor of a model -------------------------------------------------------------------------
def attribute_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, TensorProto]]:
    """(where, tensor) for every tensor of the model that is not an initializer of its graph tree.

    Initializers of the main graph and its bodies are the loader's (it maps them); this yields the rest:
    sparse initializers, tensor attributes of every node (bodies and functions too), training graphs.
    """
    stack: list[tuple[str, onnx.GraphProto, bool]] = [("the main graph", model.graph, False)]
    for function in model.functions:
        yield from _node_tensors(f"function {function.name!r}", function.node, stack)
    for index, info in enumerate(model.training_info):
        for label, graph in (("initialization", info.initialization), ("algorithm", info.algorithm)):
            stack.append((f"training info {index} {label} graph", graph, True))
    while stack:
        label, graph, with_initializers = stack.pop()
        if with_initializers:
            for tensor in graph.initializer:
                yield f"initializer {tensor.name!r} of {label}", tensor
        for sparse in graph.sparse_initializer:
            yield from _sparse_tensors(f"sparse initializer of {label}", sparse)
        yield from _node_tensors(label, graph.node, stack, with_initializers)


def _node_tensors(label: str, nodes, stack: list, with_initializers: bool = False
                  ) -> Iterator[tuple[str, TensorProto]]:
    for node in nodes:
        where = f"node {node.name!r} ({node.op_type}) of {label}"
        for attr in node.attribute:
            name = f"attribute {attr.name!r} of {where}"
            if attr.type == AttributeProto.TENSOR:
                if attr.ref_attr_name and not attr.HasField("t"):
                    continue  # a function's reference to the caller's attribute: the call holds the tensor
                yield name, attr.t
            elif attr.type == AttributeProto.TENSORS:
                for tensor in attr.tensors:
                    yield name, tensor
            elif attr.type == AttributeProto.SPARSE_TENSOR:
                yield from _sparse_tensors(name, attr.sparse_tensor)
            elif attr.type == AttributeProto.SPARSE_TENSORS:
                for sparse in attr.sparse_tensors:
                    yield from _sparse_tensors(name, sparse)
            elif attr.type == AttributeProto.GRAPH:
                stack.append((f"the body {attr.name!r} of {where}", attr.g, with_initializers))
            elif attr.type == AttributeProto.GRAPHS:
                stack.extend((f"a body {attr.name!r} of {where}", g, with_initializers) for g in attr.graphs)


def _sparse_tensors(where: str, sparse: onnx.SparseTensorProto) -> Iterator[tuple[str, TensorProto]]:
    yield f"values of {where}", sparse.values
    yield f"indices of {where}", sparse.indices


def initializer_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, TensorProto]]:
    """(where, tensor) for the initializers of the main graph and of every body in it."""
    stack = [("the main graph", model.graph)]
    while stack:
        label, graph = stack.pop()
        for tensor in graph.initializer:
            yield f"initializer {tensor.name!r} of {label}", tensor
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append((f"the body {attr.name!r} of node {node.name!r}", attr.g))
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend((f"a body {attr.name!r} of node {node.name!r}", g) for g in attr.graphs)


def check_external_data(model: onnx.ModelProto, external: ExternalData | None) -> None:
    """Refuse every external reference of an untrusted model; read in the non-initializer ones of a trusted one.

    Initializers are checked here too, so that an untrusted model is refused before anything else is done;
    a trusted model's initializers are mapped later by the loader, through ``external``.
    """
    for where, tensor in initializer_tensors(model):
        if names_external_data(tensor) and external is None:
            raise _untrusted(where, tensor)
    for where, tensor in attribute_tensors(model):
        if not names_external_data(tensor):
            continue
        if external is None:
            raise _untrusted(where, tensor)
        external.read_into(tensor, where)


#: Element types ONNX defines (TensorProto.DataType, without UNDEFINED).
_DATA_TYPES = frozenset(v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)


def check_tensor_types(model: onnx.ModelProto) -> None:
    """Every tensor of the model (initializers, attribute tensors) has an element type ONNX defines."""
    for where, tensor in (*initializer_tensors(model), *attribute_tensors(model)):
        if tensor.data_type not in _DATA_TYPES:
            raise ModelError(f"{where} has element type {tensor.data_type}, which is not one ONNX defines")


def _untrusted(where: str, tensor: TensorProto) -> ModelError:
    location = next((e.value for e in tensor.external_data if e.key == "location"), "")
    named = f" {location!r}" if location else ""
    return ModelError(f"{where} keeps its data in external file{named}; external data is only read from a "
                      f"local model given on the command line, never from an upload")
