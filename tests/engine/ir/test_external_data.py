"""No file is read on behalf of a model unless its caller vouched for a directory, and then only inside it.

Every kind of tensor onnx can decode is tried: initializers (top level and in a body), sparse initializers,
Constant / ConstantOfShape tensor attributes, sparse-tensor attributes, tensors attributes, attributes in an
If body and in a model-local function, and training graphs. Each names a secret file by a relative name (what
onnx resolves against the working directory), by an absolute path and through ``..``.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from worker.engine.errors import ModelError
from worker.engine.ir import load_model

SECRET = b"TOP SECRET: the job table of another user, 0123456789abcdef"
REPO = Path(__file__).resolve().parents[3]


def external(name: str, location: str, dims=(16,), dtype=TensorProto.UINT8, **fields) -> TensorProto:
    tensor = TensorProto(name=name, data_type=dtype, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **fields}.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    return tensor


def out(name="y", dtype=TensorProto.UINT8, shape=(16,)):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def model_of(nodes, outputs, *, inputs=(), initializers=(), sparse=(), functions=()):
    graph = helper.make_graph(nodes, "g", list(inputs), outputs, initializer=list(initializers),
                              sparse_initializer=list(sparse))
    imports = [helper.make_opsetid("", 17)] + [helper.make_opsetid(f.domain, 1) for f in functions]
    return helper.make_model(graph, opset_imports=imports, functions=list(functions))


def constant_value(location):
    return model_of([helper.make_node("Constant", [], ["y"], value=external("v", location))], [out()])


def constant_of_shape(location):
    shape = helper.make_tensor("s", TensorProto.INT64, [1], [16])
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], value=external("v", location, dims=(1,)))
    return model_of([node], [out()], initializers=[shape])


def sparse_values(location, part="values"):
    values = helper.make_tensor("values", TensorProto.UINT8, [2], [1, 2])
    indices = helper.make_tensor("indices", TensorProto.INT64, [2], [0, 3])
    if part == "values":
        values = external("values", location, dims=(2,))
    else:
        indices = external("indices", location, dims=(2,), dtype=TensorProto.INT64)
    return helper.make_sparse_tensor(values, indices, [16])


def constant_sparse(location):
    node = helper.make_node("Constant", [], ["y"], sparse_value=sparse_values(location))
    return model_of([node], [out()])


def constant_sparse_indices(location):
    node = helper.make_node("Constant", [], ["y"], sparse_value=sparse_values(location, "indices"))
    return model_of([node], [out()])


def sparse_initializer(location):
    sparse = sparse_values(location)
    sparse.values.name = "w"
    return model_of([helper.make_node("Identity", ["w"], ["y"])], [out()], sparse=[sparse])


def tensors_attribute(location):
    node = helper.make_node("Carrier", ["x"], ["y"], domain="acme", tables=[external("t", location)])
    return helper.make_model(helper.make_graph([node], "g", [out("x")], [out()]),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])


def if_body_attribute(location):
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=external("v", location))], "then",
                             [], [out("t")])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=helper.make_tensor(
        "z", TensorProto.UINT8, [16], [0] * 16))], "else", [], [out("e")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return model_of([node], [out()], inputs=[helper.make_tensor_value_info("c", TensorProto.BOOL, [])])


def if_body_initializer(location):
    then = helper.make_graph([helper.make_node("Identity", ["w"], ["t"])], "then", [], [out("t")],
                             initializer=[external("w", location)])
    other = helper.make_graph([helper.make_node("Identity", ["w2"], ["e"])], "else", [], [out("e")],
                              initializer=[helper.make_tensor("w2", TensorProto.UINT8, [16], [0] * 16)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return model_of([node], [out()], inputs=[helper.make_tensor_value_info("c", TensorProto.BOOL, [])])


def function_attribute(location):
    body = [helper.make_node("Constant", [], ["k"], value=external("v", location)),
            helper.make_node("Add", ["x", "k"], ["r"])]
    function = helper.make_function("acme", "AddSecret", ["x"], ["r"], body, [helper.make_opsetid("", 17)])
    node = helper.make_node("AddSecret", ["x"], ["y"], domain="acme")
    return model_of([node], [out()], inputs=[out("x")], functions=[function])


def training_initializer(location):
    model = model_of([helper.make_node("Identity", ["x"], ["y"])], [out()], inputs=[out("x")])
    info = model.training_info.add()
    info.initialization.name = "init"
    info.initialization.initializer.append(external("w", location))
    return model


def top_level_initializer(location):
    return model_of([helper.make_node("Identity", ["w"], ["y"])], [out()], initializers=[external("w", location)])


BUILDERS = [constant_value, constant_of_shape, constant_sparse, constant_sparse_indices, sparse_initializer,
            tensors_attribute, if_body_attribute, if_body_initializer, function_attribute, training_initializer,
            top_level_initializer]


@pytest.fixture
def secret_dir(tmp_path, monkeypatch):
    """A working directory holding the secret, and a separate directory for the models."""
    cwd = tmp_path / "server"
    cwd.mkdir()
    (cwd / "mirserve.db").write_bytes(SECRET)
    monkeypatch.chdir(cwd)
    models = tmp_path / "models"
    models.mkdir()
    return cwd, models


def locations(cwd: Path) -> list[str]:
    return ["mirserve.db", str(cwd / "mirserve.db"), "../server/mirserve.db"]


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_an_untrusted_model_naming_external_data_anywhere_is_refused_saying_where(secret_dir, build):
    cwd, models = secret_dir
    for location in locations(cwd):
        path = models / "m.onnx"
        onnx.save(build(location), str(path))
        with pytest.raises(ModelError) as caught:
            load_model(path)
        message = str(caught.value)
        assert "keeps its data in external file" in message and "never from an upload" in message
        assert SECRET.decode()[:10] not in message


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_a_trusted_model_reads_only_inside_its_directory(secret_dir, build):
    cwd, models = secret_dir
    path = models / "m.onnx"
    for location, words in (("mirserve.db", "No such file"), (str(cwd / "mirserve.db"), "leaves the model's"),
                            ("../server/mirserve.db", "leaves the model's"), ("a/../../server/mirserve.db",
                                                                                "leaves the model's")):
        onnx.save(build(location), str(path))
        with pytest.raises(ModelError, match=words):
            load_model(path, external_data_dir=models)


def test_a_link_inside_the_directory_is_not_followed(secret_dir):
    cwd, models = secret_dir
    (models / "weights.bin").symlink_to(cwd / "mirserve.db")
    onnx.save(constant_value("weights.bin"), str(models / "m.onnx"))
    with pytest.raises(ModelError, match="goes through a link"):
        load_model(models / "m.onnx", external_data_dir=models)
    (models / "sub").symlink_to(cwd, target_is_directory=True)
    onnx.save(constant_value("sub/mirserve.db"), str(models / "m.onnx"))
    with pytest.raises(ModelError, match="goes through a link"):
        load_model(models / "m.onnx", external_data_dir=models)


@pytest.mark.parametrize("fields, words", [
    ({"offset": "abc"}, "offset 'abc' is not a non-negative integer"),
    ({"offset": "-4"}, "offset '-4' is not a non-negative integer"),
    ({"offset": "1.5"}, "not a non-negative integer"),
    ({"length": "99999999999999999999999"}, "not a non-negative integer"),
    ({"offset": "64"}, "fewer than its offset 64"),
    ({"offset": "40"}, r"fewer than offset 40 \+ length 16"),
    ({"length": "8"}, "declares 8 bytes, its type and shape need 16"),
])
def test_offsets_and_lengths_must_be_integers_within_the_file(secret_dir, fields, words):
    _, models = secret_dir
    (models / "w.bin").write_bytes(bytes(range(48)))
    for build in (lambda loc: model_of([helper.make_node("Constant", [], ["y"], value=external("v", loc, **fields))],
                                       [out()]),
                  lambda loc: model_of([helper.make_node("Identity", ["w"], ["y"])], [out()],
                                       initializers=[external("w", loc, **fields)])):
        onnx.save(build("w.bin"), str(models / "m.onnx"))
        with pytest.raises(ModelError, match=words):
            load_model(models / "m.onnx", external_data_dir=models)


def test_trusted_external_data_is_read_in_for_attributes_and_mapped_for_initializers(secret_dir):
    _, models = secret_dir
    data = np.arange(64, dtype=np.uint8)
    (models / "w.bin").write_bytes(data.tobytes())
    onnx.save(constant_value("w.bin"), str(models / "m.onnx"))
    node = next(iter(load_model(models / "m.onnx", external_data_dir=models).graph))
    np.testing.assert_array_equal(node.constant_output(), data[:16])
    onnx.save(top_level_initializer("w.bin"), str(models / "m.onnx"))
    weight = load_model(models / "m.onnx", external_data_dir=models).graph.initializers["w"]
    np.testing.assert_array_equal(weight.const, data[:16])
    onnx.save(model_of([helper.make_node("Identity", ["w"], ["y"])], [out()],
                       initializers=[external("w", "w.bin", offset=16)]), str(models / "m.onnx"))
    weight = load_model(models / "m.onnx", external_data_dir=models).graph.initializers["w"]
    np.testing.assert_array_equal(weight.const, data[16:32])


def test_the_command_line_reads_beside_the_model_never_from_its_working_directory(secret_dir):
    cwd, models = secret_dir
    onnx.save(constant_value("mirserve.db"), str(models / "m.onnx"))
    done = subprocess.run([sys.executable, "-m", "worker.engine.cli", "optimize", str(models / "m.onnx"), "-o",
                           str(cwd / "out.onnx")], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1, done.stderr
    assert "cannot read external data 'mirserve.db' (No such file or directory)" in done.stderr
    assert "Traceback" not in done.stderr and not (cwd / "out.onnx").exists()


def test_only_the_tensors_module_decodes_tensors():
    """Every decode goes through worker.engine.ir.tensors.to_array, which never reads a file."""
    offenders = []
    for path in (REPO / "worker").rglob("*.py"):
        if path.name == "tensors.py" and path.parent.name == "ir":
            continue
        text = path.read_text()
        if "to_array" not in text and "load_external_data" not in text:  # nothing to find: no need to parse
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("to_array", "load_external_data_for_model",
                                                                  "load_external_data_for_tensor"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("numpy_helper", "external_data_helper", "onnx"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module in ("onnx.numpy_helper", "onnx.external_data_helper"):
                if any(alias.name in ("to_array", "load_external_data_for_model") for alias in node.names):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []
