"""Engine functions for the service benchmarks (``MIRSERVE_ENGINE=bench.engines:NAME``): the job machinery
runs for real (fork server, engine process, leases, publishing), the optimizer does not.

``sleeping`` is an I/O-bound job: one pass that waits ``MIRSERVE_BENCH_SLEEP_SECONDS`` (default 0.5), then the
model copied through unchanged, so throughput measures the service, not the CPU of this machine.
"""
from __future__ import annotations

import os
import shutil
import time


def sleeping(model_path, output_path, options, progress):
    started = time.perf_counter()
    progress(1, 1, "sleep")
    time.sleep(float(os.environ.get("MIRSERVE_BENCH_SLEEP_SECONDS", "0.5")))
    shutil.copyfile(model_path, output_path)
    size = os.path.getsize(output_path)
    return {"model": {"input": {"nodes": 1, "bytes": size}, "output": {"nodes": 1, "bytes": size}},
            "places": [options.get("places", "x86/fp32/nchw")],
            "trace": [{"pass": "sleep", "rewrites": 0, "skipped": False}],
            "seconds": round(time.perf_counter() - started, 3)}
