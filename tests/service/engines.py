"""Small engine functions for testing the job machinery (child process, lease, publish) without the optimizer.

Each has the signature of ``worker.jobs.engine.run_optimize``; its behaviour is chosen by the job's options,
which tests write straight into the job table (the API would reject these keys).
"""
from __future__ import annotations

import os
import shutil
import time

from worker.errors import ModelError


def scripted(model_path, output_path, options, progress):
    """Copy the model through ``passes`` fake passes, then do what ``options["then"]`` says."""
    passes = int(options.get("passes", 3))
    for index in range(passes):
        progress(index + 1, passes, f"fake_pass_{index + 1}")
        time.sleep(float(options.get("pass_seconds", 0)))
    then = options.get("then", "succeed")
    if then == "fail":
        raise ModelError("the file is not an ONNX model (fake engine)")
    if then == "crash":
        os.abort()
    if then == "hog":
        hoard = bytearray(int(options["hog_mb"]) << 20)
        return {"hoarded": len(hoard)}
    if then == "raise":
        raise RuntimeError("a bug in the fake engine")
    shutil.copyfile(model_path, output_path)
    size = os.path.getsize(output_path)
    external = None
    if options.get("external_data"):  # as the engine writes a model over 2 GB
        external = output_path + ".data"
        with open(external, "wb") as data:
            data.write(b"weights" * 100)
    report = {
        "model": {"input": {"nodes": 2, "bytes": size},
                  "output": {"nodes": 1, "bytes": size, "external_data": external}},
        "places": [options.get("places", "x86/fp32/nchw")],
        "trace": [{"pass": f"fake_pass_{i + 1}", "rewrites": 1, "skipped": False} for i in range(passes)],
        "verification": {"passed": True, "runs": 1, "rtol": 1e-5, "atol": 1e-6,
                         "outputs": [{"name": "y", "max_abs_diff": 0.0, "max_rel_diff": 0.0}]},
        "memory": {"arenas": [{"space": "host", "arena_bytes": 1024}], "weights_bytes": {"host": 10},
                   "macs": {"total": 99, "nodes": []}},
        "seconds": 0.01,
    }
    if options.get("no_memory"):
        del report["memory"]
    return report


def slow_optimize(model_path, output_path, options, progress):
    """The real engine, held back ``MIRSERVE_TEST_ENGINE_DELAY`` seconds at its first pass.

    Kill tests need a job that is surely mid-run when they strike; the optimization itself is the real one.
    """
    from worker.jobs.engine import run_optimize

    delay = float(os.environ.get("MIRSERVE_TEST_ENGINE_DELAY", "0"))
    state = {"slept": False}

    def slow_progress(index, total, pass_name):
        progress(index, total, pass_name)
        if not state["slept"]:
            state["slept"] = True
            time.sleep(delay)

    return run_optimize(model_path, output_path, options, slow_progress)
