"""Numeric verification: the optimized model must compute what the input model computed.

Both models run on onnxruntime's CPU provider with its graph optimizations off (so the runtime does not
"fix" either side), on seeded random inputs, in a child process: a model that crashes the runtime or eats
all memory takes the child down, not the caller. Inputs take the user's shapes; dims the user left open
take values the input model accepts (``choose_shapes``, with ``sample_shapes``'s roles: batch 1 and a second
run at 2, sequences of 16, images of 224, then larger until one runs). Integer inputs are drawn from
[0, 100) (from {0, 1} when the input's name says it is a mask).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Mapping, NamedTuple, Sequence

from worker.engine import forkserver
from worker.engine.errors import VerificationError
from worker.engine.limits import size_text
from worker.engine.runtime import cpu_session, session_options
from worker.engine.sample_values import runs_for

DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-5
FP16_RTOL, FP16_ATOL = 1e-2, 1e-3

Shapes = Mapping[str, Sequence[int]]
#: Values of the inputs that steer a model (``sample_values.steering_values``); None: a usual draw.
Values = Mapping[str, Sequence[Any]]


def choose_shapes(reference: str, *, given: Shapes | None = None, seed: int = 0,
                  timeout: float = 300, memory_mb: int = 0, chunk_bytes: int = 0,
                  mapped_bytes: int = 0, values: Values | None = None) -> dict[str, Any]:
    """Input shapes the input model runs on, for the dims ``given`` leaves open.

    Returns ``{"shapes": [first set, second set (batch 2), ...], "dims": {dim: value}, "roles": {dim: role},
    "tried": [attempts that failed, with the error], "checked": True}``; ``checked`` is False (and the first
    choice is returned untried) when onnxruntime cannot load the input model. Raises VerificationError,
    naming every attempt and suggesting --input-shape, when no choice runs.
    """
    request = {"mode": "choose", "reference": str(reference), "seed": seed, "chunk_bytes": chunk_bytes,
               "given": {k: list(v) for k, v in (given or {}).items()}, "values": dict(values or {})}
    answer = _run_child(request, timeout, memory_mb, "choosing input shapes", mapped_bytes)
    if answer.get("error"):
        raise VerificationError(answer["error"])
    return answer


def verify(reference: str, candidate: str, *, input_shapes: Shapes | None = None,
           shape_sets: Sequence[Shapes] | None = None, runs: int = 1, rtol: float = DEFAULT_RTOL,
           atol: float = DEFAULT_ATOL, seed: int = 0, timeout: float = 300, memory_mb: int = 0,
           chunk_bytes: int = 0, mapped_bytes: int = 0, same_weights: Mapping[str, Sequence] | None = None,
           shapes_checked: bool = True, values: Values | None = None, expected: str | None = None,
           candidate_stored: bool = False, reference_inline: Sequence[Sequence[str]] = ()) -> dict[str, Any]:
    """Compare the outputs of two models; raises VerificationError when they differ beyond the tolerance.

    ``shape_sets`` (from ``choose_shapes``) are the input shapes of each set of ``runs`` runs; without them,
    the shapes are chosen here from ``input_shapes``. Returns the verification report, whose ``shapes`` say
    what was verified; when the input model itself cannot run on onnxruntime, nothing can be proven, and
    the report says so with ``passed`` None and the reason under ``skipped``.

    With ``chunk_bytes``, both models run piece by piece with at most that many bytes of weights loaded at a
    time (``chunked.ChunkedSession``), for models too large to load whole; ``mapped_bytes`` is what their
    files add to the child's address space (mapped, not in its memory budget). With ``same_weights`` as well
    (the candidate's weights the optimizer left untouched, by ``regions.weight_key`` of their bytes in the
    reference's files), only the regions where the two graphs differ are compared (``regions``), unless they
    cannot be, and then the whole models (the report's ``method`` and ``regions_refused`` say which and why);
    ``shapes_checked`` False says the ``shape_sets`` were not tried on the reference, so the whole-model path
    chooses its own. ``values`` (``sample_values.steering_values``) are the values of the inputs that steer
    the model: the runs (at least ``runs``) take each in turn, so each branch they choose is compared.

    ``expected`` is a file for the reference's outputs, for a caller that verifies many candidates against
    one reference (auto mixed precision's steps): the first verification writes them there, later ones with
    the same reference, inputs and shapes read them instead of running the reference again (whole models
    only; what it holds is checked against the request, and a file that does not match is written anew).
    ``candidate_stored``: the candidate was written with its fp16 values stored in fp16 already
    (``save_stored_in_fp16``), so the child loads it as it is. ``reference_inline``: the (domain, name) of the
    reference's model-local functions whose calls the engine replaced by their bodies; the reference runs so
    too (``_stored_in_fp16``), or the fp16 values inside those bodies would be computed in fp32 on one side.
    """
    request = {"mode": "verify", "reference": str(reference), "candidate": str(candidate), "runs": runs,
               "expected": expected, "candidate_stored": candidate_stored,
               "reference_inline": [list(key) for key in reference_inline],
               "rtol": rtol, "atol": atol, "seed": seed, "chunk_bytes": chunk_bytes,
               "same_weights": None if same_weights is None else {k: list(v) for k, v in same_weights.items()},
               "shapes_checked": shapes_checked, "values": dict(values or {}),
               "given": {k: list(v) for k, v in (input_shapes or {}).items()},
               "shape_sets": None if shape_sets is None else [{k: list(v) for k, v in s.items()}
                                                              for s in shape_sets]}
    started = time.perf_counter()
    report = _run_child(request, timeout, memory_mb, "numeric verification", mapped_bytes)
    report["seconds"] = round(time.perf_counter() - started, 3)
    if report.get("error"):
        raise VerificationError(report["error"])
    if report["passed"] is False:
        worst = max(report["outputs"], key=lambda o: o["excess"])
        note = f" ({worst['note']})" if worst.get("note") else ""
        shapes = report["shapes"][worst["set"]] if report.get("shapes") else {}
        where = f" at input shapes {_describe(shapes)}" if shapes else ""
        what = "value" if report.get("method") == "regions" else "output"
        steered = ", ".join(f"{name}={chosen[worst['run'] % len(chosen)]}" for name, chosen in (values or {}).items()
                            if chosen[worst["run"] % len(chosen)] is not None)
        where += f" with {steered}" if steered else ""
        error = VerificationError(
            f"the optimized model does not compute what the input computed: {what} {worst['name']!r} "
            f"differs by up to {worst['max_abs_diff']:.3g} (relative {worst['max_rel_diff']:.3g}) "
            f"on run {worst['run']}{where}, beyond rtol {rtol:g} / atol {atol:g}{note}")
        error.mismatch = report  # the models ran and differ (auto mixed precision may act on it)
        raise error
    for entry in report["outputs"]:
        entry.pop("excess", None)
        for key in ("max_abs_diff", "max_rel_diff"):  # JSON has no infinity
            if entry[key] is not None and not math.isfinite(entry[key]):
                entry[key] = None
    return report


def value_errors(reference: str, candidate: str, *, shapes: Shapes, rtol: float, atol: float, seed: int = 0,
                 timeout: float = 300, memory_mb: int = 0, values: Values | None = None,
                 with_range: bool = False, reference_inline: Sequence[Sequence[str]] = ()) -> Any:
    """How far each value of the candidate's main graph is from the value of the same name in the reference,
    both run once on the same seeded inputs of ``shapes`` with every value as an output: the largest
    ``|candidate - reference| / (atol + rtol * |reference|)`` over its elements (1 is at the tolerance's edge;
    1e30 for a non-finite element where the reference has a finite one). An NHWC value (the reference's
    NCHW shape permuted) is compared transposed back; values that exist in one model only, or whose shapes
    differ otherwise, are left out. Raises VerificationError when either model cannot run. ``with_range``:
    (errors, the names of the reference's values with a finite element beyond fp16's range).
    ``reference_inline`` as for ``verify``."""
    request = {"mode": "errors", "reference": str(reference), "candidate": str(candidate), "rtol": rtol,
               "atol": atol, "seed": seed, "shapes": {k: list(v) for k, v in shapes.items()},
               "values": dict(values or {}), "reference_inline": [list(key) for key in reference_inline]}
    answer = _run_child(request, timeout, memory_mb, "tracing the error of every value")
    if answer.get("error"):
        raise VerificationError(answer["error"])
    return (answer["errors"], set(answer["beyond_fp16"])) if with_range else answer["errors"]


#: fp16's largest finite value.
FP16_MAX = 65504.0


#: An error for a value that is not finite where the reference's is (JSON has no infinity).
NOT_FINITE_ERROR = 1e30


#: How allocation failures read in the messages of Python, numpy, onnxruntime and the C++ runtime.
ALLOCATION_FAILURES = ("bad_alloc", "Failed to allocate", "BFCArena", "Cannot allocate memory", "MemoryError",
                       "Unable to allocate", "std::length_error")


def _run_child(request: dict, timeout: float, memory_mb: int, what: str, mapped_bytes: int = 0) -> dict:
    """Run one check in a child with its own budgets: ``timeout`` seconds of wall time, ``memory_mb`` MiB of
    address space (0: the caller's own limit). A model that runs forever (a Loop whose condition never turns
    false) or asks for more memory fails the check, naming the budget, and holds nothing after it."""
    request = {**request, "parent_pid": os.getpid(), "memory_mb": memory_mb}
    # mapped model files are not memory: they add to the address space allowed
    address_space = (memory_mb << 20) + max(0, int(mapped_bytes)) if memory_mb > 0 else 0
    env = {**os.environ, "ORT_LOGGING_LEVEL": "3"}
    try:
        child = forkserver.run(json.dumps(request), address_space=address_space, timeout=timeout, env=env)
        if child is None:  # no fork server here: a new Python
            child = subprocess.run([sys.executable, "-m", "worker.engine.numeric"], input=json.dumps(request),
                                   capture_output=True, text=True, timeout=timeout, env=env,
                                   preexec_fn=lambda: limit_address_space(address_space))
    except subprocess.TimeoutExpired:
        raise VerificationError(f"{what} did not finish within its budget of {timeout:g} s (limit verify_seconds; "
                                f"raise it with --limit verify_seconds=N)") from None
    lines = child.stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        if memory_mb > 0 and any(marker in child.stderr for marker in ALLOCATION_FAILURES):
            raise VerificationError(f"{what} needed more memory than its budget of {memory_mb} MiB (limit "
                                    f"verify_memory_mb; raise it with --limit verify_memory_mb=N)")
        tail = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise VerificationError(f"{what} crashed: {tail[:300]}")
    return json.loads(lines[-1])


def limit_address_space(wanted: int) -> None:
    """Limit this process's address space to ``wanted`` bytes (0: leave it), within its hard limit."""
    if wanted > 0:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            wanted = min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))


def _describe(shapes: Shapes) -> str:
    from worker.engine.sample_shapes import describe_shapes

    return describe_shapes(shapes)


# --- the child -------------------------------------------------------------------------------------
_DTYPES = {"float": "float32", "float16": "float16", "double": "float64", "int64": "int64", "int32": "int32",
           "int16": "int16", "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
           "uint64": "uint64", "bool": "bool"}


def _specs(session) -> list:
    from worker.engine.sample_shapes import InputSpec

    specs = []
    for item in session.get_inputs():
        element = item.type[len("tensor("):-1] if item.type.startswith("tensor(") else item.type
        dims = None if item.shape is None else tuple(d if isinstance(d, int) else (d or None) for d in item.shape)
        specs.append(InputSpec(item.name, element, dims))
    return specs


class InputTooLarge(MemoryError):
    """An input whose values would not fit in what this process may allocate; the message names it."""


def _check_input_size(name: str, dims: Sequence[int], itemsize: int) -> None:
    """Refuse an input larger than this process's address space allows (the child's memory budget), before
    numpy is asked for it (it refuses sizes beyond its own maximum with a bare ValueError)."""
    import resource

    nbytes = math.prod(dims) * itemsize  # Python integers: declared dims cannot wrap around
    allowed, _ = resource.getrlimit(resource.RLIMIT_AS)
    if allowed == resource.RLIM_INFINITY:
        allowed = 1 << 62
    if nbytes > allowed:
        raise InputTooLarge(f"verification cannot make input {name!r} of shape {'x'.join(map(str, dims))}: its "
                            f"values alone take {size_text(nbytes)}, more than the check may allocate (limit "
                            f"verify_memory_mb; give smaller shapes with --input-shape {name}=D0,D1,...)")


def _feeds(session, shapes: Mapping[str, Sequence[int]], rng, values: Values | None = None, run: int = 0) -> dict:
    """Random inputs of ``shapes``; an input of ``values`` takes its value for ``run`` (None: drawn)."""
    import numpy as np

    feeds = {}
    for item in session.get_inputs():
        dims = [int(d) for d in shapes[item.name]]
        kind = item.type[len("tensor("):-1] if item.type.startswith("tensor(") else item.type
        if kind not in _DTYPES:
            raise ValueError(f"input {item.name!r} has type {item.type}, which verification cannot generate")
        dtype = np.dtype(_DTYPES[kind])
        _check_input_size(item.name, dims, dtype.itemsize)
        if dtype == np.bool_:  # an array even at rank 0, where the comparison gives a numpy scalar
            feeds[item.name] = np.asarray(rng.random(dims) > 0.5)
        elif np.issubdtype(dtype, np.floating):
            feeds[item.name] = rng.random(dims).astype(dtype)
        else:
            high = 2 if "mask" in item.name.lower() else 100
            feeds[item.name] = rng.integers(0, high, dims).astype(dtype)
        chosen = (values or {}).get(item.name)
        if chosen and chosen[run % len(chosen)] is not None:
            feeds[item.name] = np.full(dims, chosen[run % len(chosen)], dtype=dtype)
    return feeds


#: Weight bytes per piece when the request asks to run the models piece by piece (0: whole).
_CHUNK_BYTES = 0


def _stored_in_fp16(source, inline: Sequence[Sequence[str]] = ()):
    """The model (a path or its bytes) with every fp16 value its main graph passes between nodes stored in fp16,
    as bytes, or ``source`` itself when it has none. The calls of the model-local functions ``inline`` names
    ((domain, name) pairs) are replaced by their bodies first, as the engine's loader replaced them.

    onnxruntime's CPU provider has no fp16 kernel for most ops: it runs them in fp32 between casts it
    inserts, and then drops each Cast(fp32 -> fp16) -> Cast(fp16 -> fp32) pair as redundant, even with graph
    optimizations off. An fp16 model then computes in fp32 from end to end, and verification would miss
    what fp16 does to it (rounding, overflow to infinity); an input model with fp16 values, too. Two Identities
    on each fp16 value (real fp16 kernels; a lone one between ops without fp16 kernels is itself run in fp32)
    keep the casts apart, so each value is rounded to fp16 as a device computing in fp16 stores it. Both
    models of a verification run so: for a model without fp16 values nothing changes (nor for one run piece
    by piece, too large to load whole).
    """
    import onnx

    if _CHUNK_BYTES:  # a model run piece by piece is not loaded whole: as it is
        return source
    model = onnx.load(source) if isinstance(source, str) else (
        onnx.load_from_string(source) if isinstance(source, bytes) else source)
    if inline and model.functions:
        from pathlib import Path

        from worker.engine.ir.functions import inline_calls

        wanted = {tuple(key) for key in inline}
        model, _ = inline_calls(model, lambda domain, name: (domain, name) in wanted, Path("the input model"))
        source = model.SerializeToString()
    if not _names_fp16(model):
        return source
    if not _declares_every_value(model.graph):
        try:  # types of the values the model does not declare
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - what it declares is used
            pass
    return model.SerializeToString() if _store_fp16_values(model.graph) else source


def store_fp16_values(model) -> bool:
    """Rewrite ``model`` (a ModelProto, its initializers left out or not) in place as ``_stored_in_fp16`` would,
    for a caller that writes the candidates of many verifications (auto mixed precision's steps): the child
    then loads the file as it is, without parsing, inferring and serializing it again (``verify``'s
    ``candidate_stored``). False, and ``model`` untouched, where the model leaves a value's type undeclared
    (the child's shape inference, which needs the weights, would find it)."""
    if not _declares_every_value(model.graph):
        return False
    _store_fp16_values(model.graph)
    return True


def save_stored_in_fp16(model, path) -> bool:
    """Write the engine's ``model`` at ``path`` as verification runs it (``store_fp16_values`` on what is
    written, the weights streamed as ``save_model`` streams them); False when it is written as it is, and the
    child must store its fp16 values itself."""
    from worker.engine.ir import save_model

    stored = []
    save_model(model, path, edit=lambda proto: stored.append(store_fp16_values(proto)))
    return stored[0]


def _declares_every_value(graph) -> bool:
    known = {v.name for v in (*graph.value_info, *graph.input, *graph.output)}
    return all(name in known for node in graph.node for name in node.output if name)


def _store_fp16_values(graph) -> bool:
    """Two Identities on each fp16 value ``graph``'s nodes pass between them (``_stored_in_fp16``); False when
    it has none."""
    import onnx

    fp16 = {v.name for v in (*graph.value_info, *graph.input, *graph.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    consumed = {name for node in graph.node for name in node.input}
    if not fp16 & consumed:
        return False
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for slot, name in enumerate(node.output):
            if name in fp16 and name in consumed:
                computed, widened = f"{name}__computed", f"{name}__fp16"
                node.output[slot] = computed
                nodes += [onnx.helper.make_node("Identity", [computed], [widened], name=f"{name}__stored_fp16"),
                          onnx.helper.make_node("Identity", [widened], [name], name=f"{name}__kept_fp16")]
    del graph.node[:]
    graph.node.extend(nodes)
    return True


def _names_fp16(model) -> bool:
    """The model's main graph declares an fp16 value, holds an fp16 constant or casts to fp16."""
    import onnx

    half = onnx.TensorProto.FLOAT16
    graph = model.graph
    return (any(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == half
                for v in (*graph.value_info, *graph.input, *graph.output))
            or any(t.data_type == half for t in graph.initializer)
            or any(a.name == "to" and a.i == half for n in graph.node if n.op_type == "Cast" for a in n.attribute)
            or any(a.t.data_type == half for n in graph.node if n.op_type == "Constant" for a in n.attribute
                   if a.HasField("t")))


def _session(path):
    if _CHUNK_BYTES:
        from worker.engine.chunked import ChunkedSession

        return ChunkedSession(path, _CHUNK_BYTES)

    return cpu_session(path)


def _choose(session, given: Mapping[str, Sequence[int]], seed: int, *, try_them: bool = True,
            steering: Values | None = None) -> dict:
    """The first level of values for the open dims on which the model runs, and batch 2 when it has one;
    an error naming every attempt when none runs. Without open dims, the given and declared shapes."""
    import numpy as np

    from worker.engine import sample_shapes as sample

    specs = _specs(session)
    unknown = [s.name for s in specs if s.name not in given and s.dims is None]
    if unknown:
        return {"error": f"input {unknown[0]!r} declares no rank, so no shape can be chosen for it: give its "
                         f"shape with --input-shape {unknown[0]}=D0,D1,..."}
    dims = sample.open_dims(specs, given)
    roles = {d.key: d.role for d in dims}
    if not dims:  # nothing to choose: a model that fails on these shapes has nothing to prove
        return {"shapes": [sample.shapes(specs, given, {})], "dims": {}, "roles": {}, "tried": [],
                "checked": False}
    tried: list[str] = []
    for level in range(sample.LEVELS):
        values = sample.assignment(dims, level)
        shapes = sample.shapes(specs, given, values)
        if tried and sample.describe_shapes(shapes) in (t.split(": ", 1)[0] for t in tried):
            continue  # the same shapes as a level before (no dim of a role whose value changes)
        error = _runs(session, shapes, np.random.default_rng(seed), steering) if try_them else None
        if error is None:
            found = [shapes]
            second = sample.assignment(dims, level, batch=sample.SECOND_BATCH)
            if any(d.role == "batch" for d in dims):
                more = sample.shapes(specs, given, second)
                more_error = _runs(session, more, np.random.default_rng(seed), steering) if try_them else None
                if more_error is None:
                    found.append(more)
                else:
                    tried.append(f"{sample.describe_shapes(more)}: {more_error}")
            return {"shapes": found, "dims": values, "roles": roles, "tried": tried, "checked": try_them}
        tried.append(f"{sample.describe_shapes(shapes)}: {error}")
    named = ", ".join(f"{d.label} ({d.role}, at {', '.join(f'{n}[{a}]' for n, a in d.where)})" for d in dims)
    return {"error": f"the input model runs on none of the input shapes tried for its open dims {named}: "
                     f"{'; '.join(tried)}. Give the input shapes with --input-shape NAME=D0,D1,... "
                     f"(option input_shapes)"}


def _runs(session, shapes, rng, values: Values | None = None) -> str | None:
    """None when the model runs on random inputs of these shapes, else onnxruntime's error, shortened."""
    try:
        session.run(None, _feeds(session, shapes, rng, values))
        return None
    except Exception as exc:
        return runtime_message(exc, 200)


def runtime_message(exc: BaseException, limit: int = 300) -> str:
    """onnxruntime's error on one line, without its status prefix, the model's path, source paths and C++
    signatures (a service's clients must not learn where the server keeps files)."""
    import re

    text = " ".join(str(exc).split())
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"Load model from .*? failed: ?", "", text)
    text = re.sub(r"/onnxruntime_src/\S+:\d+ (\S+\(.*?\) )?", "", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _shapes_text(feeds: dict) -> str:
    return ", ".join(f"{name}={'x'.join(str(d) for d in value.shape) or 'scalar'}" for name, value in feeds.items())


def _compare(name: str, expected, actual, rtol: float, atol: float, run: int) -> dict:
    """How far ``actual`` is from ``expected``: element types and shapes must be equal; numbers within
    ``atol + rtol * |expected|`` (fp16's tolerances at least, for an fp16 output), NaN where NaN is, an
    infinity where the same infinity is; other elements (strings) equal. A sequence output is compared
    element by element (its worst element counts)."""
    import numpy as np

    if isinstance(expected, (list, tuple)) or isinstance(actual, (list, tuple)):
        return _compare_sequences(name, expected, actual, rtol, atol, run)
    expected, actual = np.asarray(expected), np.asarray(actual)
    entry = {"name": name, "run": run, "shape": list(expected.shape)}
    failed = {**entry, "passed": False, "max_abs_diff": float("inf"), "max_rel_diff": float("inf"),
              "excess": float("inf")}
    if expected.dtype != actual.dtype:
        return {**failed, "note": f"element type {actual.dtype} instead of {expected.dtype}"}
    if expected.shape != actual.shape:
        return {**failed, "note": f"shape {list(actual.shape)} instead of {entry['shape']}"}
    if expected.dtype.kind not in "biuf" or expected.size == 0:
        same = bool(np.array_equal(expected, actual))
        return {**entry, "passed": same, "max_abs_diff": 0.0, "max_rel_diff": 0.0, "excess": 0.0 if same else 1}
    if expected.dtype == np.float16:  # no tighter than the type resolves: one fp16 ulp is ~1e-3 relative
        rtol, atol = max(rtol, FP16_RTOL), max(atol, FP16_ATOL)
    a, b = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        equal = (a == b) | (np.isnan(a) & np.isnan(b))  # the same infinity is equal, and NaN where NaN is
        diff = np.where(equal, 0.0, np.abs(a - b))
        diff = np.where(np.isnan(diff), np.inf, diff)
        allowed = np.where(np.isfinite(a), atol + rtol * np.abs(a), 0.0)
        excess = float(np.max(diff - allowed))
        rel = diff / np.maximum(np.abs(a), np.finfo(np.float64).tiny)
    return {**entry, "passed": bool(excess <= 0), "max_abs_diff": float(diff.max()),
            "max_rel_diff": float(np.nan_to_num(rel, nan=np.inf).max()), "excess": excess}


def _compare_sequences(name: str, expected, actual, rtol: float, atol: float, run: int) -> dict:
    entry = {"name": name, "run": run, "shape": [len(expected)] if isinstance(expected, (list, tuple)) else []}
    if not isinstance(expected, (list, tuple)) or not isinstance(actual, (list, tuple)) \
            or len(expected) != len(actual):
        return {**entry, "passed": False, "max_abs_diff": float("inf"), "max_rel_diff": float("inf"),
                "excess": float("inf"), "note": "a sequence of another length, or not a sequence"}
    worst = {**entry, "passed": True, "max_abs_diff": 0.0, "max_rel_diff": 0.0, "excess": 0.0}
    for element_expected, element_actual in zip(expected, actual):
        element = _compare(name, element_expected, element_actual, rtol, atol, run)
        if element["excess"] > worst["excess"] or not element["passed"]:
            worst = {**element, "shape": entry["shape"]}
    return worst


def _out_of_memory(exc: BaseException, request: dict) -> str | None:
    """The message for a run that failed for want of memory under the child's budget, else None."""
    budget = request.get("memory_mb") or 0
    if budget <= 0 or not (isinstance(exc, MemoryError) or any(m in str(exc) for m in ALLOCATION_FAILURES)):
        return None
    return (f"numeric verification needed more memory than its budget of {budget} MiB (limit verify_memory_mb; "
            f"raise it with --limit verify_memory_mb=N)")


def warm_up() -> None:
    """Pay in the fork server, once, what each forked check would pay on its own first use: the pieces of
    numpy a comparison builds lazily, and onnxruntime's environment and kernel registry, which its first
    session makes. That session has no thread pool (one intra-op and one inter-op thread: the calling one),
    so the server stays safe to fork; it is dropped at once and never runs."""
    import numpy as np
    from onnx import TensorProto, helper

    _compare("warm-up", np.zeros(2, np.float32), np.ones(2, np.float32), DEFAULT_RTOL, DEFAULT_ATOL, 0)
    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in ("x", "y"))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "warm_up", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    options = session_options(threads=1)
    options.inter_op_num_threads = 1
    cpu_session(model.SerializeToString(), options)


def _child(request: dict) -> dict:
    global _CHUNK_BYTES
    _CHUNK_BYTES = int(request.get("chunk_bytes") or 0)
    if request.get("mode") == "choose":
        return _child_choose(request)
    if request.get("mode") == "errors":
        return _child_errors(request)
    return _child_verify(request)


def _child_choose(request: dict) -> dict:
    try:
        reference = _session(request["reference"])
    except Exception as exc:  # nothing will run it: the first choice, untried
        return {**_first_choice(request["reference"], request["given"]), "skipped": runtime_message(exc)}
    if _ungenerated(reference):  # verification will say so; nothing to choose
        return {"shapes": None, "dims": {}, "roles": {}, "tried": [], "checked": False}
    return _choose(reference, request["given"], request["seed"], steering=request.get("values"))


def _child_errors(request: dict) -> dict:
    """Each shared value's error and the reference's values beyond fp16's range (``value_trace``), both models
    with their fp16 values stored in fp16, as verification runs the candidate."""
    import numpy as np

    from worker.engine.value_trace import traced_errors

    try:
        reference = _loaded(_stored_in_fp16(request["reference"], request.get("reference_inline", ())))
        candidate = _loaded(_stored_in_fp16(request["candidate"]))
        feeds = _feeds(_Inputs(reference), request["shapes"], np.random.default_rng(request["seed"]),
                       request.get("values"))
        return traced_errors(reference, candidate, request["shapes"], feeds, rtol=request["rtol"],
                             atol=request["atol"], memory_mb=int(request.get("memory_mb") or 0), fp16_max=FP16_MAX,
                             not_finite=NOT_FINITE_ERROR,
                             is_allocation_failure=lambda exc: isinstance(exc, MemoryError)
                             or any(m in str(exc) for m in ALLOCATION_FAILURES))
    except InputTooLarge as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - either model failed to load or run
        return {"error": f"tracing the error of every value failed: {runtime_message(exc)}"}


def _loaded(source):
    import onnx

    return onnx.load(source) if isinstance(source, str) else onnx.load_from_string(source)


class _Inputs:
    """A model's inputs as a session lists them (``_feeds`` draws from them), without a session."""

    def __init__(self, model):
        import onnx

        weights = {t.name for t in model.graph.initializer}
        types = {v: k for k, v in _DTYPES.items()}
        self.inputs = []
        for value in model.graph.input:
            if value.name in weights or not value.type.HasField("tensor_type"):
                continue
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            self.inputs.append(_Port(value.name, f"tensor({types.get(dtype.name, dtype.name)})", None))

    def get_inputs(self) -> list:
        return self.inputs


def _ungenerated(session) -> str | None:
    """Why verification cannot draw inputs for the model (a sequence, map or optional input), or None."""
    for item in session.get_inputs():
        kind = item.type[len("tensor("):-1] if item.type.startswith("tensor(") else None
        if kind not in _DTYPES:
            return f"verification cannot generate input {item.name!r} of type {item.type}"
    return None


def _first_choice(path: str, given: dict) -> dict:
    """The shapes of the first level, from the model's declared inputs, without running it."""
    import onnx

    from worker.engine import sample_shapes as sample

    model = onnx.load(path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for item in model.graph.input:
        if item.name in initializers or not item.type.HasField("tensor_type"):
            continue
        tensor = item.type.tensor_type
        element = onnx.helper.tensor_dtype_to_string(tensor.elem_type).rpartition(".")[2].lower()
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in tensor.shape.dim) if tensor.HasField("shape") else None
        specs.append(sample.InputSpec(item.name, element, dims))
    try:
        return sample.first_choice(specs, given)
    except ValueError as exc:
        return {"error": str(exc)}


class _Recorded:
    """The reference's side of a verification as a file (``verify(expected=...)``): its inputs, output names,
    chosen shapes and the outputs of each run, written by the first verification against it and played back
    by the next, which then neither loads nor runs the reference. It stands in for the reference's session
    where the verification uses one; its ``run`` answers the runs in the order they were recorded, and each
    run's inputs must be the recorded ones (a digest of them is kept)."""

    def __init__(self, request: dict, session=None):
        self.key = _expected_key(request)
        self.session = session
        self.inputs, self.outputs, self.choice = [], [], None
        self.runs: list[tuple[str, list]] = []  # (digest of the inputs, outputs)
        self._next = 0
        if session is not None:
            self.inputs = [_Port(i.name, i.type, i.shape) for i in session.get_inputs()]
            self.outputs = [_Port(o.name, o.type, o.shape) for o in session.get_outputs()]

    def get_inputs(self) -> list:
        return self.inputs

    def get_outputs(self) -> list:
        return self.outputs

    def run(self, names, feeds) -> list:
        digest = _digest(feeds)
        if self.session is not None:  # recording
            found = self.session.run(names, feeds)
            self.runs.append((digest, found))
            return found
        recorded_digest, found = self.runs[self._next]
        if recorded_digest != digest or list(names) != [o.name for o in self.outputs]:
            raise _NotRecorded("the inputs differ from the recorded run's")
        self._next += 1
        return found

    def save(self, path: str) -> None:
        """Write what was recorded (nothing when an output is not an array of numbers, which npz cannot hold)."""
        import numpy as np

        if any(not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf" for _, found in self.runs for a in found):
            return
        meta = {"key": self.key, "inputs": [list(p) for p in self.inputs], "outputs": [list(p) for p in self.outputs],
                "choice": self.choice, "digests": [d for d, _ in self.runs]}
        arrays = {f"run{i}_{k}": a for i, (_, found) in enumerate(self.runs) for k, a in enumerate(found)}
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "wb") as out:
            np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
        os.replace(partial, path)

    @classmethod
    def load(cls, request: dict) -> "_Recorded | None":
        """What the file holds, when it was recorded for this request; else None."""
        import numpy as np

        path = request.get("expected")
        if not path or not os.path.exists(path):
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta["key"] != _expected_key(request):
                    return None
                found = cls(request)
                found.inputs = [_Port(*p) for p in meta["inputs"]]
                found.outputs = [_Port(*p) for p in meta["outputs"]]
                found.choice = meta["choice"]
                found.runs = [(digest, [data[f"run{i}_{k}"] for k in range(len(found.outputs))])
                              for i, digest in enumerate(meta["digests"])]
        except (OSError, ValueError, KeyError):  # unreadable or another layout: recorded again
            return None
        return found


class _NotRecorded(Exception):
    """A verification asked the recorded reference for a run it does not hold."""


class _Port(NamedTuple):
    """An input or output of a session as verification reads it."""

    name: str
    type: str
    shape: Any


def _expected_key(request: dict) -> dict:
    """What the reference's outputs depend on: the file as it is, the draws and the shapes."""
    path = request["reference"]
    stat = os.stat(path)
    return {"reference": os.path.abspath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            **{k: request.get(k) for k in ("runs", "seed", "values", "given", "shape_sets")}}


def _digest(feeds: Mapping[str, Any]) -> str:
    import hashlib

    import numpy as np

    hashed = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        hashed.update(f"{name}:{array.dtype}:{array.shape}".encode())
        hashed.update(array.tobytes())
    return hashed.hexdigest()


def _child_verify(request: dict) -> dict:
    if request.get("expected") and not _CHUNK_BYTES:
        recorded = _Recorded.load(request)
        if recorded is not None:
            try:
                return _verify_with(recorded, request)
            except _NotRecorded:
                pass
    return _verify_with(None, request)


def _verify_with(recorded: "_Recorded | None", request: dict) -> dict:
    """The verification, against the reference's recorded outputs when ``recorded`` is given; recording them
    when the request asks for them and none were."""
    import numpy as np

    try:
        inline = request.get("reference_inline", ())
        reference = recorded or _session(_stored_in_fp16(request["reference"], inline))
    except Exception as exc:
        return {"passed": None, "skipped": f"onnxruntime cannot run the input model: {runtime_message(exc)}",
                "outputs": [], "runs": 0}
    recording = None
    if recorded is None and request.get("expected") and not _CHUNK_BYTES:
        recording = reference = _Recorded(request, reference)
    try:
        candidate = _session(request["candidate"] if request.get("candidate_stored")
                             else _stored_in_fp16(request["candidate"]))
        unloadable = None
    except Exception as exc:
        # Not yet the optimized model's fault: an input that loads but fails whenever it runs (an exporter's
        # shapes that disagree) fails at load once folding has made those shapes static. The input's first
        # run below decides which model to name.
        candidate, unloadable = None, f"onnxruntime cannot load the optimized model: {runtime_message(exc)}"
    reason = _ungenerated(reference)
    if reason is not None:
        return {"passed": None, "skipped": reason, "outputs": [], "runs": 0}
    method: dict[str, Any] = {"method": "whole model"}
    if candidate is not None and request.get("same_weights") is not None and _CHUNK_BYTES:
        by_regions = _verify_regions(reference, candidate, request)
        if by_regions.get("passed") is not None:
            return by_regions
        method["regions_refused"] = by_regions["refused"]
        if not request.get("shapes_checked", True):  # untried shapes: the whole models choose their own
            request = {**request, "shape_sets": None}
    shape_sets = request.get("shape_sets")
    choice = None
    values = request.get("values") or {}
    runs = max(request["runs"], runs_for(values))
    if shape_sets is None:
        if recorded is not None:
            if recorded.choice is None:
                raise _NotRecorded("no choice of shapes was recorded")
            choice = recorded.choice
        else:
            choice = _choose(recording.session if recording is not None else reference, request["given"],
                             request["seed"], steering=values)
        if choice.get("error"):
            return choice if unloadable is None else {"error": f"{unloadable}; and {choice['error']}"}
        shape_sets = choice["shapes"]
        if recording is not None:
            recording.choice = choice
    names = [o.name for o in reference.get_outputs()]
    wanted = set() if candidate is None else {i.name for i in candidate.get_inputs()}
    rtol, atol = request["rtol"], request["atol"]
    outputs: dict[str, dict] = {}
    for index, shapes in enumerate(shape_sets):
        for run in range(runs):
            rng = np.random.default_rng(request["seed"] + run)
            try:
                feeds = _feeds(reference, shapes, rng, values, run)
            except InputTooLarge as exc:
                return {"error": str(exc)}
            try:
                expected = reference.run(names, feeds)
            except _NotRecorded:
                raise
            except Exception as exc:
                if _out_of_memory(exc, request):
                    return {"error": _out_of_memory(exc, request)}
                skipped = (f"onnxruntime cannot run the input model on inputs of shapes {_shapes_text(feeds)}: "
                           f"{runtime_message(exc)}")
                if unloadable is not None:
                    skipped += f" (the optimized model does not load either: {unloadable.split(': ', 1)[1]})"
                return {"passed": None, "skipped": skipped, "outputs": [], "runs": 0, "shapes": shape_sets}
            if candidate is None:
                return {"error": unloadable}
            try:
                actual = candidate.run(names, {k: v for k, v in feeds.items() if k in wanted})
            except Exception as exc:
                if _out_of_memory(exc, request):
                    return {"error": _out_of_memory(exc, request)}
                return {"error": f"onnxruntime cannot run the optimized model on inputs of shapes "
                                 f"{_shapes_text(feeds)}: {runtime_message(exc)}"}
            for name, a, b in zip(names, expected, actual):
                entry = {**_compare(name, a, b, rtol, atol, run), "set": index}
                if name not in outputs or entry["excess"] > outputs[name]["excess"]:
                    outputs[name] = entry
    ordered = [outputs[n] for n in names]
    report = {"passed": all(o["passed"] for o in ordered), "runs": runs * len(shape_sets),
              "rtol": rtol, "atol": atol, "seed": request["seed"], "outputs": ordered, "shapes": shape_sets,
              **method, **({"values": dict(values)} if values else {})}
    report["summary"] = f"verified on the whole model, max abs diff {_largest_diff(ordered)}"
    if choice is not None and choice["dims"]:
        report.update(dims=choice["dims"], roles=choice["roles"], tried=choice["tried"])
    if recording is not None:
        recording.save(request["expected"])
    return report


def _verify_regions(reference, candidate, request: dict) -> dict:
    """Verification by regions (``regions``): the report, or ``{"passed": None, "refused": why}`` when the
    models cannot be compared so (the caller then runs them whole)."""
    from worker.engine.regions import RegionPlan, RegionsRefused, verify_regions

    shape_sets = request.get("shape_sets")
    if shape_sets is None:
        choice = _choose(reference, request["given"], request["seed"], try_them=False,
                         steering=request.get("values"))
        if choice.get("error"):
            return {"passed": None, "refused": choice["error"]}
        shape_sets = choice["shapes"]
    try:
        plan = RegionPlan(reference, candidate, request["same_weights"], shape_sets, _CHUNK_BYTES)
        values = request.get("values")  # each run's draw: the first value of each steering input
        found = verify_regions(plan, lambda shapes, rng: _feeds(reference, shapes, rng, values), shape_sets,
                               runs=request["runs"], seed=request["seed"], rtol=request["rtol"],
                               atol=request["atol"], compare=_compare)
    except RegionsRefused as exc:
        return {"passed": None, "refused": str(exc)}
    except Exception as exc:  # onnxruntime could not run a region: the whole models will tell
        if _out_of_memory(exc, request):
            return {"passed": None, "refused": _out_of_memory(exc, request)}
        return {"passed": None, "refused": f"a region did not run: {runtime_message(exc)}"}
    report = {**found, "method": "regions", "runs": request["runs"] * len(shape_sets), "rtol": request["rtol"],
              "atol": request["atol"], "seed": request["seed"], "shapes": shape_sets}
    report["summary"] = (f"verified by regions: {found['regions']} regions, {found['region_nodes']} of "
                         f"{found['nodes']} nodes, max abs diff {_largest_diff(found['outputs'])}")
    return report


def _largest_diff(outputs) -> str:
    diffs = [o["max_abs_diff"] for o in outputs if isinstance(o.get("max_abs_diff"), (int, float))]
    return f"{max(diffs):.3g}" if diffs else "none (no numeric values)"


def main(parent_pid: int | None = None) -> None:
    """Run the check read on stdin and print its answer; ``parent_pid``: the process to die with, when not the
    one that asked (a fork server's child dies with the server, which dies with the engine)."""
    from worker.engine.children import die_with_parent

    request = json.loads(sys.stdin.read())
    if not die_with_parent(parent_pid or request["parent_pid"]):  # whoever asked is gone: nobody reads the answer
        sys.exit(1)
    print(json.dumps(_child(request)))


if __name__ == "__main__":
    main()
