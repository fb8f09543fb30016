"""Conformance: every node test case of onnx (``onnx.backend.test.case.node.collect_testcases()``, each a model
with inputs and expected outputs) through ``optimize()`` in seven configurations, as onnxruntime runs the same
suite against itself.

Configurations: ``default`` (x86/fp32/nchw), ``portable`` (standard ONNX ops only), ``arm_fp16`` (arm/fp16/nhwc,
arm/fp32/nchw), ``opencl_fp16`` (opencl/fp16/nchw, arm/fp32/nchw), ``cuda`` (cuda/fp32/nchw), ``npu_int8``
(npu/int8/nchw, arm/fp32/nchw: the quantized cases on int8 kernels), and ``folded``
(default places, the case's inputs baked in as initializers, so the whole graph goes through constant folding
and the one-node evaluator). Each case ends as one of:

- ``matched``: the optimized model, on onnxruntime, gives the expected outputs (the case's tolerance; fp16's
  where a place computes in fp16). Where onnxruntime's own result for the input model differs from onnx's
  expected outputs, the optimized model must give onnxruntime's result (it cannot be asked to fix the runtime);
  for a non-deterministic op (two runs of the input model differ) types and shapes must match;
- ``refused``: ``optimize`` raised a user-facing error, and onnxruntime cannot run the input model either;
- ``unrunnable``: ``optimize`` wrote a model, but onnxruntime can run neither it nor the input model (an opset
  or IR version newer than it supports, an op it lacks), so there is nothing to compare;
- a failure: ``crash`` (an internal error: any exception that is not a user error, or a user error caused by
  one), ``refused_runnable`` (a user-facing refusal of a model onnxruntime runs), ``unloadable`` (onnxruntime
  loaded the input model but not the output), ``wrong`` (outputs differ), ``timeout``.

Verification (``optimize``'s own check on random inputs) is off here: the expected outputs are the stronger
check, and a verification failure would hide what went wrong.

Usage: python bench/conformance.py [--config NAME ...] [--match SUBSTRING] [--jobs N] [--json FILE]
                                   [--failures] [--timeout SECONDS]
Prints a summary line per configuration (cases, matched, refused with the top refusal reasons, failures).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the project runs from its checkout (it need not be installed)
    sys.path.insert(0, str(REPO))

from bench.pool import Pool  # noqa: E402

#: Tolerances where some place computes in fp16 (the engine's own verification uses the same).
FP16_RTOL, FP16_ATOL = 1e-2, 1e-3
OUTCOMES = ("matched", "refused", "unrunnable", "crash", "refused_runnable", "unloadable", "wrong", "timeout")
FAILURES = frozenset(OUTCOMES[3:])


@dataclass(frozen=True)
class Config:
    name: str
    places: str = "x86/fp32/nchw"
    portable: bool = False
    folded: bool = False
    #: Some place computes in fp16: outputs are compared with fp16 tolerances.
    half: bool = False

    def options(self, **overrides: Any):
        from worker.engine.options import OptimizeOptions

        return OptimizeOptions(places=self.places, portable=self.portable, verify=False, **overrides)


CONFIGS: dict[str, Config] = {c.name: c for c in (
    Config("default"),
    Config("portable", portable=True),
    Config("arm_fp16", places="arm/fp16/nhwc,arm/fp32/nchw", half=True),
    Config("opencl_fp16", places="opencl/fp16/nchw,arm/fp32/nchw", half=True),
    Config("cuda", places="cuda/fp32/nchw"),
    Config("npu_int8", places="npu/int8/nchw,arm/fp32/nchw"),
    Config("folded", folded=True),
)}


@dataclass
class Outcome:
    case: str
    config: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0
    #: Facts worth a note: onnxruntime disagrees with onnx's expected outputs, the op is non-deterministic.
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


# --- the cases ----------------------------------------------------------------------------------------------
def all_cases() -> list:
    """Every node test case onnx ships (about 1,900; collecting them takes a few seconds)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # the case generators overflow casts on purpose
        warnings.simplefilter("ignore")
        return list(collect_testcases())


def cases_named(names: Iterable[str]) -> list:
    """The cases with these names, importing only the modules that generate them (fast, for the test suite).

    onnx generates a module's cases when the module is imported; ``module:name`` picks the module explicitly
    where it is not the op name without underscores (``reduce_log_sum:test_reduce_log_sum_empty_set``).
    """
    import importlib
    import warnings

    import onnx.backend.test.case.node as node_cases

    wanted: dict[str, str] = {}
    for spec in names:
        module, _, name = spec.rpartition(":")
        wanted[name] = module or _module_of(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in sorted(set(wanted.values())):
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    found = {c.name: c for c in node_cases._NodeTestCases if c.name in wanted}
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise LookupError(f"no onnx node test case named {missing[0]!r} in module {wanted[missing[0]]!r}")
    return [found[name] for name in wanted]


def _module_of(name: str) -> str:
    """The module whose name, without underscores, is the longest prefix of the case's (``test_`` dropped)."""
    import pkgutil

    import onnx.backend.test.case.node as node_cases

    flat = re.sub(r"^test_", "", name).replace("_", "").lower()
    modules = [m.name for m in pkgutil.iter_modules(node_cases.__path__) if not m.ispkg]
    matches = [m for m in modules if flat.startswith(m.replace("_", "").lower())]
    if not matches:
        raise LookupError(f"no onnx node test module generates {name!r}; name it as MODULE:{name}")
    return max(matches, key=len)


# --- comparing ------------------------------------------------------------------------------------------------
def _structure(value: Any) -> str:
    import numpy as np

    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return "sequence[" + ",".join(_structure(v) for v in value) + "]"
    array = np.asarray(value)
    return f"{array.dtype}{list(array.shape)}"


def difference(expected: Any, actual: Any, rtol: float, atol: float, *, values: bool = True) -> str | None:
    """Why ``actual`` is not ``expected`` (tensors, sequences of them, or None for an empty optional), or None.

    dtypes and shapes must be equal; numbers within ``atol + rtol * |expected|``, NaN where NaN is expected,
    an infinity where the same infinity is; other elements (strings, bools) equal. ``values=False`` compares
    only types and shapes (for non-deterministic ops).
    """
    import numpy as np

    if expected is None or actual is None or isinstance(expected, (list, tuple)) \
            or isinstance(actual, (list, tuple)):
        if _structure(expected) != _structure(actual):
            return f"{_structure(actual)} instead of {_structure(expected)}"
        if expected is None:
            return None
        for k, (e, a) in enumerate(zip(expected, actual)):
            why = difference(e, a, rtol, atol, values=values)
            if why:
                return f"sequence element {k}: {why}"
        return None
    e, a = np.asarray(expected), np.asarray(actual)
    if e.dtype != a.dtype:
        return f"dtype {a.dtype} instead of {e.dtype}"
    if e.shape != a.shape:
        return f"shape {list(a.shape)} instead of {list(e.shape)}"
    if not values or e.size == 0:
        return None
    if e.dtype == np.float16:  # no tighter than the type resolves (onnxruntime computes fp16 runs in fp32)
        rtol, atol = max(rtol, FP16_RTOL), max(atol, FP16_ATOL)
    if e.dtype.kind not in "fciu" or e.dtype.itemsize < 1:
        equal = e == a
        if e.dtype.kind == "f":
            equal |= np.isnan(e) & np.isnan(a)
        return None if bool(np.all(equal)) else f"{int(np.sum(~equal))} of {e.size} elements differ"
    if e.dtype.kind in "iu":
        if np.array_equal(e, a):
            return None
        bad = np.flatnonzero(e.reshape(-1) != a.reshape(-1))
        return (f"{bad.size} of {e.size} elements differ (first at {bad[0]}: {a.reshape(-1)[bad[0]]} instead "
                f"of {e.reshape(-1)[bad[0]]})")
    e64, a64 = e.astype(np.complex128 if e.dtype.kind == "c" else np.float64), a.astype(
        np.complex128 if e.dtype.kind == "c" else np.float64)
    nan_e, nan_a = np.isnan(e64), np.isnan(a64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.isclose(a64, e64, rtol=rtol, atol=atol) | (nan_e & nan_a) | (
            np.isinf(e64) & (e64 == a64))
    close &= nan_e == nan_a
    if bool(np.all(close)):
        return None
    bad = np.flatnonzero(~close.reshape(-1))
    first = bad[0]
    return (f"{bad.size} of {e.size} elements differ beyond rtol {rtol:g} / atol {atol:g} (first at {first}: "
            f"{a64.reshape(-1)[first]} instead of {e64.reshape(-1)[first]})")


# --- one case ---------------------------------------------------------------------------------------------
def _session(model_bytes_or_path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes_or_path, options, providers=["CPUExecutionProvider"])


def _feeds(model, inputs: Sequence[Any]) -> dict[str, Any]:
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    return dict(zip(names, inputs))


def as_array(data: Any) -> Any:
    """A case's tensor as numpy (onnx gives some as TensorProto, for types numpy lacks, and scalars as numpy
    scalars); sequences element by element; None (an empty optional) as is."""
    import numpy as np
    import onnx

    if data is None:
        return None
    if isinstance(data, (list, tuple)):
        return [as_array(d) for d in data]
    if isinstance(data, onnx.TensorProto):
        return onnx.numpy_helper.to_array(data)
    return np.asarray(data)


def _is_numpy_native(array) -> bool:
    return array.dtype.kind in "biufcUSOb" and array.dtype.name in __import__("numpy").sctypeDict


def _ort_value(data: Any):
    """An onnxruntime value for a tensor; one of a type numpy lacks (bfloat16, float8, int4) is written
    through its bytes, as onnx packs them (two int4 per byte)."""
    import ctypes

    import numpy as np
    import onnx
    import onnxruntime as ort

    if not isinstance(data, np.ndarray):
        return data
    if _is_numpy_native(data):
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(data))
    proto = onnx.numpy_helper.from_array(data)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(data.shape), proto.data_type, "cpu", 0)
    if len(proto.raw_data) != value.tensor_size_in_bytes():
        raise TypeError(f"cannot feed a {data.dtype} tensor to onnxruntime")
    ctypes.memmove(value.data_ptr(), proto.raw_data, len(proto.raw_data))
    return value


def run_session(session, feeds: dict[str, Any]) -> list:
    """All outputs, as numpy; tensors of types numpy lacks come back through their bytes.

    The inputs are copies: onnxruntime writes into a caller's buffer when an Identity passes a graph input to
    a kernel that works in place (BatchNormalization's running mean in training mode), and the case's data
    would change for the next run."""
    import ctypes

    import onnx

    feeds = {name: _copy(value) for name, value in feeds.items()}
    exotic = any(isinstance(v, __import__("numpy").ndarray) and not _is_numpy_native(v) for v in feeds.values())
    outputs = [o for o in session.get_outputs()]
    if not exotic and not any(_exotic_type(o.type) for o in outputs):
        return session.run(None, feeds)
    values = session.run_with_ort_values(None, {k: _ort_value(v) for k, v in feeds.items()})
    result = []
    for value in values:
        if not value.is_tensor() or not _exotic_type(value.data_type()):
            result.append(value.numpy())
            continue
        raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
        proto = onnx.TensorProto(dims=value.shape(), data_type=_ONNX_TYPES[value.data_type()], raw_data=raw)
        result.append(onnx.numpy_helper.to_array(proto))
    return result


def _copy(value: Any) -> Any:
    import numpy as np

    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return np.array(value, copy=True) if isinstance(value, np.ndarray) else value


def _onnx_types() -> dict[str, int]:
    import onnx

    return {f"tensor({name.lower()})": number for name, number in onnx.TensorProto.DataType.items()}


_ONNX_TYPES = _onnx_types()
_NATIVE_TYPES = frozenset({"float", "double", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                           "uint32", "uint64", "bool", "string"})


def _exotic_type(text: str) -> bool:
    return text.startswith("tensor(") and text[len("tensor("):-1] not in _NATIVE_TYPES


def _short(text: Any, limit: int = 300) -> str:
    """One line of at most ``limit`` characters; onnxruntime's source paths and C++ signatures taken out."""
    text = " ".join(str(text).split())
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+:\d+ (\S+\(.*?\) )?", "", text)
    text = re.sub(r"Load model from \S+ failed:", "", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class Reference:
    """What onnxruntime makes of the input model: its outputs, or why it cannot load or run it."""

    outputs: list | None = None
    error: str | None = None
    loads: bool = True
    deterministic: bool = True


def reference(case) -> Reference:
    inputs = as_array(case.data_sets[0][0])
    try:
        session = _session(case.model.SerializeToString())
    except Exception as exc:
        return Reference(error=f"onnxruntime cannot load the input model: {_short(exc)}", loads=False)
    feeds = _feeds(case.model, inputs)
    try:
        first = run_session(session, feeds)
        second = run_session(session, feeds)
    except Exception as exc:
        return Reference(error=f"onnxruntime cannot run the input model: {_short(exc)}")
    same = all(difference(a, b, 0.0, 0.0) is None for a, b in zip(first, second))
    return Reference(outputs=first, deterministic=same)


def folded_model(case):
    """The case's model with its (first data set's) inputs as initializers and no graph inputs.

    Sequence and optional inputs cannot be initializers: such cases keep them as inputs.
    """
    import numpy as np
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs = as_array(case.data_sets[0][0])
    kept = []
    for info, data in zip(list(model.graph.input), inputs):
        if isinstance(data, np.ndarray) and info.type.HasField("tensor_type"):
            model.graph.initializer.append(onnx.numpy_helper.from_array(data, info.name))
        else:
            kept.append(info)
    del model.graph.input[:]
    model.graph.input.extend(kept)
    if model.ir_version < 4:  # initializers that are not inputs need IR 4
        model.ir_version = 4
    return model


def is_internal(exc: BaseException) -> bool:
    """An exception that is not a user error, or a user error raised because of one (a pass that crashed)."""
    from worker.engine.errors import MirserveError

    if not isinstance(exc, MirserveError):
        return True
    cause = exc.__cause__
    return cause is not None and not isinstance(cause, MirserveError)


def run_case(case, config: Config, workdir: Path, ref: Reference | None = None) -> Outcome:
    """Optimize one case in one configuration and say how it ended."""
    import onnx

    from worker.engine.api import optimize

    started = time.perf_counter()
    outcome = Outcome(case.name, config.name, "")
    ref = reference(case) if ref is None else ref
    model = folded_model(case) if config.folded else case.model
    source, target = workdir / f"{case.name}.{config.name}.in.onnx", workdir / f"{case.name}.{config.name}.out.onnx"
    onnx.save(model, source)
    try:
        optimize(source, target, config.options())
    except Exception as exc:  # noqa: BLE001 - every exception is classified
        if is_internal(exc):
            outcome.outcome = "crash"
            outcome.detail = _short(f"{type(exc).__name__}: {exc}" + _cause(exc), 600)
        elif ref.outputs is None:
            outcome.outcome, outcome.detail = "refused", _short(str(exc))
        else:
            outcome.outcome, outcome.detail = "refused_runnable", _short(str(exc))
        return _done(outcome, started, source, target)
    outcome.outcome, outcome.detail = _check_output(case, config, ref, target, outcome.notes)
    return _done(outcome, started, source, target)


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__
    if cause is None:
        return ""
    frames = traceback.extract_tb(cause.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f" [{type(cause).__name__}{where}]"


def _done(outcome: Outcome, started: float, *paths: Path) -> Outcome:
    outcome.seconds = round(time.perf_counter() - started, 3)
    for path in paths:
        path.unlink(missing_ok=True)
    return outcome


def _check_output(case, config: Config, ref: Reference, target: Path, notes: list[str]) -> tuple[str, str]:
    if ref.error is not None:
        notes.append(ref.error)
    try:
        session = _session(str(target))
    except Exception as exc:
        return ("unloadable", _short(exc)) if ref.loads else ("unrunnable", _short(exc))
    if ref.outputs is None:
        return "unrunnable", f"the output loads but the input model does not run: {ref.error}"
    try:
        actual = run_session(session, _feeds_for(session, case))
    except Exception as exc:
        return "wrong", f"onnxruntime cannot run the output: {_short(exc)}"
    expected = as_array(case.data_sets[0][1])
    rtol, atol = (max(case.rtol, FP16_RTOL), max(case.atol, FP16_ATOL)) if config.half else (case.rtol, case.atol)
    if not ref.deterministic:
        notes.append("non-deterministic: types and shapes compared")
        why = _first_difference(ref.outputs, actual, rtol, atol, values=False)
        return ("wrong", why) if why else ("matched", "")
    if _first_difference(expected, ref.outputs, case.rtol, case.atol) is not None:
        notes.append("onnxruntime differs from onnx's expected outputs: compared with onnxruntime's")
        expected = ref.outputs
    why = _first_difference(expected, actual, rtol, atol)
    return ("wrong", why) if why else ("matched", "")


def _feeds_for(session, case) -> dict[str, Any]:
    names = [i.name for i in session.get_inputs()]
    given = [i.name for i in case.model.graph.input]
    by_name = dict(zip(given, as_array(case.data_sets[0][0])))
    return {name: by_name[name] for name in names if name in by_name}


def _first_difference(expected: Sequence, actual: Sequence, rtol: float, atol: float, *,
                      values: bool = True) -> str | None:
    if len(expected) != len(actual):
        return f"{len(actual)} outputs instead of {len(expected)}"
    for k, (e, a) in enumerate(zip(expected, actual)):
        why = difference(e, a, rtol, atol, values=values)
        if why:
            return f"output {k}: {why}"
    return None


# --- running many, in worker processes a crash or a hang cannot take down -----------------------------
_CASES: list = []  # set by main before the workers fork
_REFERENCES: dict[int, Reference] = {}


def _run_task(task: tuple[int, str]) -> dict:
    """One (case index, configuration) in a worker: the reference of a case is kept while its
    configurations run back to back."""
    index, config = task
    case = _CASES[index]
    try:
        if index not in _REFERENCES:
            _REFERENCES.clear()
            _REFERENCES[index] = reference(case)
        with tempfile.TemporaryDirectory(prefix="mirserve-conformance-") as workdir:
            return asdict(run_case(case, CONFIGS[config], Path(workdir), _REFERENCES[index]))
    except Exception as exc:  # noqa: BLE001 - a bug of this harness, reported as the case's crash
        return asdict(Outcome(case.name, config, "crash", _short(f"harness: {type(exc).__name__}: {exc}")))


def _failed_task(task: tuple[int, str], kind: str, detail: str) -> dict:
    index, config = task
    return asdict(Outcome(_CASES[index].name, config, kind, detail))


# --- the summary ----------------------------------------------------------------------------------------------
def _reason_key(detail: str) -> str:
    """A refusal's message with names and numbers taken out, to count refusals by reason."""
    text = re.sub(r"'[^']*'", "'…'", detail)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return text[:140]


def summarize(outcomes: list[Outcome], configs: Sequence[str]) -> list[str]:
    lines = []
    for name in configs:
        mine = [o for o in outcomes if o.config == name]
        counts = collections.Counter(o.outcome for o in mine)
        failures = ", ".join(f"{counts[k]} {k}" for k in OUTCOMES[3:])
        lines.append(f"{name}: {len(mine)} cases, {counts['matched']} matched, {counts['refused']} refused, "
                     f"{counts['unrunnable']} unrunnable, {failures} ({sum(o.seconds for o in mine):.0f} s)")
        for kind in ("refused", "unrunnable"):
            reasons = collections.Counter(_reason_key(o.detail) for o in mine if o.outcome == kind)
            for reason, count in reasons.most_common(3):
                lines.append(f"    {kind} {count}x: {reason}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", choices=list(CONFIGS),
                        help="run only this configuration (repeatable; default: all six)")
    parser.add_argument("--match", action="append", default=[],
                        help="run only cases whose name contains this (repeatable)")
    parser.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                        help="worker processes (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one case may take (default: 120)")
    parser.add_argument("--json", metavar="FILE", help="write every outcome as JSON here")
    parser.add_argument("--failures", action="store_true", help="print every failure (default: the first 40)")
    args = parser.parse_args(argv)
    configs = args.config or list(CONFIGS)
    started = time.perf_counter()
    cases = [c for c in all_cases() if not args.match or any(m in c.name for m in args.match)]
    print(f"{len(cases)} cases x {len(configs)} configurations, {args.jobs} processes", flush=True)
    tasks = [(i, config) for i in range(len(cases)) for config in configs]
    outcomes: list[Outcome] = []
    _CASES[:] = cases
    with Pool(_run_task, _failed_task, args.jobs, args.timeout) as pool:
        for answer in pool.map(tasks):
            outcomes.append(Outcome(**answer))
            if len(outcomes) % 500 == 0:
                print(f"  {len(outcomes)} of {len(tasks)} done, "
                      f"{sum(o.failed for o in outcomes)} failures", flush=True)
    failures = sorted((o for o in outcomes if o.failed), key=lambda o: (o.config, o.outcome, o.case))
    for outcome in failures if args.failures else failures[:40]:
        print(f"FAIL {outcome.config} {outcome.case}: {outcome.outcome}: {outcome.detail}")
    if len(failures) > 40 and not args.failures:
        print(f"... and {len(failures) - 40} more (--failures prints them all)")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    for line in summarize(outcomes, configs):
        print(line)
    print(f"{len(outcomes)} runs in {time.perf_counter() - started:.0f} s: "
          f"{len(failures)} failures ({', '.join(f'{k} {v}' for k, v in collections.Counter(o.outcome for o in failures).items()) or 'none'})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
