"""Shared fixtures: the real models (corpus and light model zoo) and helpers to build one-rule models."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

# The suite writes bytecode even where PYTHONDONTWRITEBYTECODE is set (as on the project's machines and in the
# Dockerfile): without it pytest rewrote the asserts of every test module again on each run (40% of the
# collection's CPU), and every child the suite starts (servers, command lines, engine processes) compiled
# mirserve's modules again, which an installed package never does. The children still write nothing: they
# read what this process wrote.
sys.dont_write_bytecode = False
# The suite runs strict: a pass that raises fails the run instead of being undone with a warning, so that no
# bug hides behind the fail-soft default. Tests of that default ask for strict=False themselves.
os.environ.setdefault("MIRSERVE_STRICT", "1")
# The service's tests run it as a local `mirserve serve` without API keys, which sees every job; the auth tests
# (tests/service/test_auth.py) ask for MIRSERVE_AUTH=keys themselves.
os.environ.setdefault("MIRSERVE_AUTH", "none")


def _find_corpus() -> Path:
    """``shared/corpus`` beside the checkout (or beside one of its parents, for git worktrees)."""
    if os.environ.get("MIRSERVE_CORPUS"):
        return Path(os.environ["MIRSERVE_CORPUS"])
    repo = Path(__file__).resolve().parents[1]
    for parent in repo.parents:
        candidate = parent / "shared" / "corpus"
        if candidate.is_dir():
            return candidate
    return repo.parent / "shared" / "corpus"


CORPUS = _find_corpus()
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

#: Static input shapes for the corpus models whose inputs are dynamic (from the corpus README).
CORPUS_SHAPES = {
    "bert_small_dyn.onnx": {"input_ids": [2, 64], "attention_mask": [2, 64]},
    "ch_PP-OCRv4_det_infer.onnx": {"x": [1, 3, 640, 640]},
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": {"x": [1, 3, 48, 192]},
    "cls_qdq.onnx": {"x": [1, 3, 48, 192]},
}
LIGHT_MODELS = ["light_bvlc_alexnet", "light_densenet121", "light_inception_v1", "light_inception_v2",
                "light_resnet50", "light_shufflenet", "light_squeezenet", "light_vgg19", "light_zfnet512"]


def corpus_models() -> list[Path]:
    return [CORPUS / name for name in CORPUS_SHAPES]


def light_models() -> list[Path]:
    return [LIGHT / f"{name}.onnx" for name in LIGHT_MODELS]


def all_models() -> list[Path]:
    """Every real model the claims are tested on."""
    return corpus_models() + light_models()


def shapes_for(path: Path) -> dict:
    return CORPUS_SHAPES.get(Path(path).name, {})


def model_id(path: Path) -> str:
    return Path(path).stem


def _names_a_real_model(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(map(_names_a_real_model, value))
    if isinstance(value, str) and value.endswith(".onnx") and "/" in value:
        value = Path(value)
    if isinstance(value, Path):
        return value.suffix == ".onnx" and value.parent in (CORPUS, LIGHT)
    return isinstance(value, str) and (value in CORPUS_SHAPES or value in LIGHT_MODELS)


def pytest_collection_modifyitems(config, items):
    """A test parametrized over a real model (a corpus file or a light-zoo model, by path or by name), or whose
    code opens one (it names ``CORPUS``, ``LIGHT``, ``light_models()`` or ``all_models()``, or a module constant
    that is a real model's path or name, itself or through a helper of the test's module or a fixture), runs real
    models: it gets the ``models`` mark, so ``-m "not models"`` stays the quick loop without each such test
    having to remember the mark. A test whose code or fixtures start the service (``_SERVICE_CODE``) gets the ``service`` mark:
    ``-m "not models and not service"`` leaves out the tests that wait on real servers and processes."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec and any(_names_a_real_model(v) for v in callspec.params.values()) \
                or any(_opens_a_real_model(function) for function in _test_and_fixture_functions(item)
                       if function is not _corpus_present.__wrapped__):  # it checks the files, runs none
            item.add_marker(pytest.mark.models)
        if any(_starts_the_service(function) for function in _test_and_fixture_functions(item)):
            item.add_marker(pytest.mark.service)


@functools.cache
def _opens_a_real_model(function) -> bool:
    """The function's code reads a real model: it names ``CORPUS``, ``LIGHT``, ``light_models`` or ``all_models``
    (``_REAL_MODEL_NAMES``), or a global of its module that is a real model's path or name
    (``BERT = CORPUS / "bert_small_dyn.onnx"``, ``MODEL = "cls_qdq.onnx"``), or a function of a test module
    that does (a helper that submits the model). It reads the names the compiled code uses, not the source:
    reading the source of every helper cost a second of the collection."""
    return _names_one(function, set())


def _names_one(function, seen: set) -> bool:
    import inspect

    function = inspect.unwrap(function) if callable(function) else function
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    module_globals = getattr(function, "__globals__", {})
    for name in _global_names(code):
        value = module_globals.get(name)
        if name in _REAL_MODEL_NAMES or _names_a_real_model(value):
            return True
        if inspect.isfunction(value) and value.__module__.startswith("tests.") and _names_one(value, seen):
            return True
    return False


def _global_names(code) -> set[str]:
    """The global names a function's code (and the code of the functions and lambdas nested in it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


#: The names of tests/conftest.py through which a test reaches the real models.
_REAL_MODEL_NAMES = frozenset({"CORPUS", "LIGHT", "light_models", "all_models"})


def _test_and_fixture_functions(item) -> list:
    """The test's function and the function of every fixture it uses, directly or through other fixtures."""
    info = getattr(item, "_fixtureinfo", None)
    fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs]
    return [getattr(item, "function", None), *fixtures]


@functools.cache
def _starts_the_service(function) -> bool:
    """The function's compiled code (with the functions and lambdas nested in it) reads one of
    ``_SERVICE_NAMES`` or holds the string ``_SERVICE_MODULE``. It reads the names the code uses, as
    ``_opens_a_real_model`` does, not the source: tokenizing the source of every test and fixture function cost
    0.7 s of each collection (in each xdist worker)."""
    import inspect

    code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
    return code is not None and (not _SERVICE_NAMES.isdisjoint(_global_names(code)) or _SERVICE_MODULE in
                                 _string_constants(code))


def _string_constants(code) -> set[str]:
    """The string constants of a function's code and of the code nested in it."""
    found = set()
    for const in code.co_consts:
        if isinstance(const, str):
            found.add(const)
        elif hasattr(const, "co_consts"):
            found |= _string_constants(const)
    return found


#: What starts the service for real: ``mirserve serve``/``api``/``worker`` processes (tests.service.server), an
#: API on a real socket (tests.client.conftest), a JobWorker (whose jobs run in real engine processes); and the
#: module that starts an engine process on its own, run with ``python -m``.
_SERVICE_NAMES = frozenset({"Server", "ServiceProcess", "worker_process", "running_service", "JobWorker"})
_SERVICE_MODULE = "tests.service.start_engine"


@pytest.fixture(scope="session", autouse=True)
def _corpus_present():
    missing = [p for p in corpus_models() if not p.exists()]
    if missing:
        pytest.fail(f"the model corpus is missing ({missing[0]}); it lives in ../shared/corpus beside the "
                    f"checkout, or set MIRSERVE_CORPUS")


@pytest.fixture(autouse=True)
def _cheap_key_hashing(monkeypatch):
    """API keys made in a test are hashed with scrypt at N=2^4 instead of the production 2^14 (33 ms each, about
    two seconds of every run). A hash records its own cost, so checking a key is the same code either way;
    tests/service/test_auth.py undoes this to check the production cost."""
    from worker.jobs import keys

    monkeypatch.setattr(keys, "SCRYPT_N", 1 << 4)


def run_onnxruntime(path, feeds: dict) -> list[np.ndarray]:
    """Run a model on onnxruntime's CPU provider with graph optimizations off, as the engine does."""
    from worker.engine.runtime import cpu_session

    return cpu_session(str(path)).run(None, feeds)


def random_feeds(path, shapes: dict | None = None, seed: int = 0) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for item in model.graph.input:
        if item.name in initializers:
            continue
        tensor = item.type.tensor_type
        dims = (shapes or {}).get(item.name) or [d.dim_value if d.dim_value > 0 else 1 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[item.name] = rng.random(dims).astype(dtype)
        elif dtype == np.bool_:
            feeds[item.name] = np.asarray(rng.random(dims) > 0.5)
        else:
            high = 2 if "mask" in item.name else 100
            feeds[item.name] = rng.integers(0, high, dims).astype(dtype)
    return feeds


def save_proto(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, **kwargs) -> onnx.ModelProto:
    """A small model for a test of one rule (checked by onnx.checker)."""
    graph = onnx.helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], **kwargs)
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model)
    return model


def tensor(name: str, array) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(array), name)


def vinfo(name: str, elem=onnx.TensorProto.FLOAT, shape=None) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem, shape)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory):
    """``mirserve serve`` itself (API and embedded worker, the real engine) as a user starts it, shared by the
    tests that drive it from outside: the client, the remote CLI, the pictures, the web page."""
    from tests.service.server import Server

    with Server(tmp_path_factory.mktemp("serve") / "data", max_upload_mb=64) as running:
        yield running
