"""Archives for the upload tests: a small model with external data packed as zip, tar and tar.gz, and every
hostile form (absolute path, ``..``, links, devices, a 10 GB declared size, compression bombs)."""
from __future__ import annotations

import gzip
import io
import stat
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHTS = "weights.bin"


def model_with_external_data(directory: Path, location: str = WEIGHTS, name: str = "model.onnx") -> Path:
    """``y = x @ W + b`` with W and b (64x64 and 64 floats) in ``location`` beside the model."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], initializer=[weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    return path


def model_naming(location: str) -> bytes:
    """A model whose weight claims to live at ``location`` (it is never written there)."""
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="length", value="16")
    graph = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def pack(kind: str, files: dict[str, bytes]) -> bytes:
    """Plain members in a ``zip``, ``tar`` or ``tar.gz``."""
    if kind == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in files.items():
                archive.writestr(name, data)
        return buffer.getvalue()
    return tar(kind, [(_file_info(name, data), data) for name, data in files.items()])


def pack_directory(kind: str, directory: Path) -> bytes:
    return pack(kind, {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()})


def tar(kind: str, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0) if kind == "tar.gz" else raw


def _file_info(name: str, data: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


HOSTILE_CASES = ("absolute_path", "dot_dot", "symlink_tar", "symlink_zip", "hard_link", "device", "fifo",
                 "ten_gb_declared", "zip_bomb", "gzip_bomb", "two_models", "twice")


def hostile(model: bytes) -> dict[str, tuple[bytes, str]]:
    """Hostile uploads beside a good model: name -> (archive bytes, the member a refusal must name)."""
    zeros = bytes(4 << 20)  # above the 1 MiB under which ratios are not judged
    symlink_zip = io.BytesIO()
    with zipfile.ZipFile(symlink_zip, "w") as archive:
        archive.writestr("model.onnx", model)
        link = zipfile.ZipInfo("weights.bin")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    bomb_zip = io.BytesIO()
    with zipfile.ZipFile(bomb_zip, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model.onnx", model)
        archive.writestr("weights.bin", zeros)
    huge = _file_info("weights.bin", b"")
    huge.size = 10 << 30  # declared only: the data is not there
    good = (_file_info("model.onnx", model), model)
    return {
        "absolute_path": (tar("tar", [good, (_file_info("/tmp/mirserve-escape.bin", b"x"), b"x")]),
                          "/tmp/mirserve-escape.bin"),
        "dot_dot": (tar("tar", [good, (_file_info("../mirserve-escape.bin", b"x"), b"x")]), "../mirserve-escape.bin"),
        "symlink_tar": (tar("tar", [good, (_special("weights.bin", tarfile.SYMTYPE, "/etc/passwd"), None)]),
                        "weights.bin"),
        "symlink_zip": (symlink_zip.getvalue(), "weights.bin"),
        "hard_link": (tar("tar", [good, (_special("weights.bin", tarfile.LNKTYPE, "/etc/passwd"), None)]),
                      "weights.bin"),
        "device": (tar("tar", [good, (_special("weights.bin", tarfile.CHRTYPE), None)]), "weights.bin"),
        "fifo": (tar("tar", [good, (_special("weights.bin", tarfile.FIFOTYPE), None)]), "weights.bin"),
        "ten_gb_declared": (tar("tar", [good, (huge, None)]), "weights.bin"),
        "zip_bomb": (bomb_zip.getvalue(), "weights.bin"),
        "gzip_bomb": (tar("tar.gz", [good, (_file_info("weights.bin", zeros), zeros)]), "weights.bin"),
        "two_models": (pack("zip", {"model.onnx": model, "other.onnx": model}), "other.onnx"),
        "twice": (tar("tar", [good, good]), "model.onnx"),
    }
