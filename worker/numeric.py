"""Numeric verification: the optimized model must compute what the input model computed.

Both models run on onnxruntime's CPU provider with its graph optimizations off (so the runtime does not
"fix" either side), on seeded random inputs, in a child process: a model that crashes the runtime or eats
all memory takes the child down, not the caller. Inputs take the user's shapes, unknown dims as 1; integer
inputs are drawn from [0, 100) (from {0, 1} when the input's name says it is a mask).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from worker.errors import VerificationError

DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-5
FP16_RTOL, FP16_ATOL = 1e-2, 1e-3


def verify(reference: str, candidate: str, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
           runs: int = 1, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL, seed: int = 0,
           timeout: float = 900) -> dict[str, Any]:
    """Compare the outputs of two models; raises VerificationError when they differ beyond the tolerance.

    Returns the verification report; when the input model itself cannot run on onnxruntime, nothing can
    be proven, and the report says so with ``passed`` None and the reason under ``skipped``.
    """
    request = {"parent_pid": os.getpid(), "reference": str(reference), "candidate": str(candidate),
               "runs": runs, "rtol": rtol, "atol": atol, "seed": seed,
               "shapes": {k: list(v) for k, v in (input_shapes or {}).items()}}
    started = time.perf_counter()
    try:
        child = subprocess.run([sys.executable, "-m", "worker.numeric"], input=json.dumps(request),
                               capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, "ORT_LOGGING_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        raise VerificationError(f"numeric verification did not finish within {timeout:.0f} s") from None
    lines = child.stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        tail = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise VerificationError(f"numeric verification crashed: {tail[:300]}")
    report = json.loads(lines[-1])
    report["seconds"] = round(time.perf_counter() - started, 3)
    if report.get("error"):
        raise VerificationError(report["error"])
    if report["passed"] is False:
        worst = max(report["outputs"], key=lambda o: o["excess"])
        note = f" ({worst['note']})" if worst.get("note") else ""
        raise VerificationError(
            f"the optimized model does not compute what the input computed: output {worst['name']!r} "
            f"differs by up to {worst['max_abs_diff']:.3g} (relative {worst['max_rel_diff']:.3g}) "
            f"on run {worst['run']}, beyond rtol {rtol:g} / atol {atol:g}{note}")
    for entry in report["outputs"]:
        entry.pop("excess", None)
        for key in ("max_abs_diff", "max_rel_diff"):  # JSON has no infinity
            if entry[key] is not None and not math.isfinite(entry[key]):
                entry[key] = None
    return report


# --- the child -------------------------------------------------------------------------------------
def _feeds(session, shapes: dict, rng) -> dict:
    import numpy as np

    feeds = {}
    for item in session.get_inputs():
        dims = shapes.get(item.name) or [d if isinstance(d, int) and d > 0 else 1 for d in item.shape]
        kind = item.type[len("tensor("):-1] if item.type.startswith("tensor(") else "float"
        dtype = {"float": np.float32, "float16": np.float16, "double": np.float64, "int64": np.int64,
                 "int32": np.int32, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}.get(kind)
        if dtype is None:
            raise ValueError(f"input {item.name!r} has type {item.type}, which verification cannot generate")
        if dtype == np.bool_:
            feeds[item.name] = rng.random(dims) > 0.5
        elif np.issubdtype(dtype, np.floating):
            feeds[item.name] = rng.random(dims).astype(dtype)
        else:
            high = 2 if "mask" in item.name.lower() else 100
            feeds[item.name] = rng.integers(0, high, dims).astype(dtype)
    return feeds


def _session(path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _compare(name: str, expected, actual, rtol: float, atol: float, run: int) -> dict:
    import numpy as np

    entry = {"name": name, "run": run, "shape": list(np.shape(expected))}
    if np.shape(expected) != np.shape(actual):
        return {**entry, "passed": False, "max_abs_diff": float("inf"), "max_rel_diff": float("inf"),
                "excess": float("inf"), "note": f"shape {list(np.shape(actual))} instead of {entry['shape']}"}
    a = np.asarray(expected, dtype=np.float64) if np.asarray(expected).dtype != object else None
    b = np.asarray(actual, dtype=np.float64) if a is not None else None
    if a is None or a.size == 0:
        same = a is not None or list(np.ravel(expected)) == list(np.ravel(actual))
        return {**entry, "passed": same, "max_abs_diff": 0.0, "max_rel_diff": 0.0, "excess": 0.0 if same else 1}
    both_nan = np.isnan(a) & np.isnan(b)
    diff = np.where(both_nan, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    allowed = atol + rtol * np.abs(a)
    excess = float(np.max(diff - allowed))
    rel = diff / np.maximum(np.abs(a), np.finfo(np.float64).tiny)
    return {**entry, "passed": bool(excess <= 0), "max_abs_diff": float(diff.max()),
            "max_rel_diff": float(rel.max()), "excess": excess}


def _child(request: dict) -> dict:
    import numpy as np

    try:
        reference = _session(request["reference"])
    except Exception as exc:
        return {"passed": None, "skipped": f"onnxruntime cannot run the input model: {str(exc)[:300]}",
                "outputs": [], "runs": 0}
    try:
        candidate = _session(request["candidate"])
    except Exception as exc:
        return {"error": f"onnxruntime cannot load the optimized model: {str(exc)[:300]}"}
    names = [o.name for o in reference.get_outputs()]
    rtol, atol = request["rtol"], request["atol"]
    outputs: dict[str, dict] = {}
    for run in range(request["runs"]):
        rng = np.random.default_rng(request["seed"] + run)
        feeds = _feeds(reference, request["shapes"], rng)
        wanted = {i.name for i in candidate.get_inputs()}
        expected = reference.run(names, feeds)
        try:
            actual = candidate.run(names, {k: v for k, v in feeds.items() if k in wanted})
        except Exception as exc:
            return {"error": f"onnxruntime cannot run the optimized model: {str(exc)[:300]}"}
        for name, a, b in zip(names, expected, actual):
            entry = _compare(name, a, b, rtol, atol, run)
            if name not in outputs or entry["excess"] > outputs[name]["excess"]:
                outputs[name] = entry
    ordered = [outputs[n] for n in names]
    return {"passed": all(o["passed"] for o in ordered), "runs": request["runs"], "rtol": rtol, "atol": atol,
            "seed": request["seed"], "outputs": ordered}


def main() -> None:
    from worker.process import die_with_parent

    request = json.loads(sys.stdin.read())
    if not die_with_parent(request["parent_pid"]):  # whoever asked is gone: nobody will read the answer
        sys.exit(1)
    print(json.dumps(_child(request)))


if __name__ == "__main__":
    main()
