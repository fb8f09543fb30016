"""How the engine runs onnxruntime: one way to open a CPU session, shared by verification, constant folding
and the chunked runner.

Every session runs the model as written (graph optimizations off: verification must run the model, not
onnxruntime's rewrite of it) and its intra-op threads do not spin. onnxruntime's threads otherwise busy-wait
for the next operator after finishing one; on a machine whose cores are all taken (a worker running
several jobs, two test processes on two cores) that waiting takes the cores from the work: measured on a
loaded 2-core machine, a torchvision Inception v3 export (80x80, five runs) took 0.19-0.29 CPU-s with
spinning and 0.13 without, and its wall time did not rise (``bench/ort_spinning.py``).
"""
from __future__ import annotations

from typing import Any


def session_options(*, threads: int = 0, log_severity: int = 3, arena: bool = True, spinning: bool = False) -> Any:
    """Session options for an engine session: ``threads`` intra-op threads (0: onnxruntime's choice, one
    per physical core), not spinning unless ``spinning`` (onnxruntime's default, for comparison);
    ``arena`` off frees each buffer when the run drops it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = log_severity
    options.intra_op_num_threads = threads
    for pool in ("intra_op", "inter_op"):
        options.add_session_config_entry(f"session.{pool}.allow_spinning", "1" if spinning else "0")
    if not arena:
        options.enable_cpu_mem_arena = False
    return options


def cpu_session(model: str | bytes, options: Any = None) -> Any:
    """An onnxruntime session of ``model`` (a path or serialized bytes) on the CPU provider."""
    import onnxruntime as ort

    return ort.InferenceSession(model, options if options is not None else session_options(),
                                providers=["CPUExecutionProvider"])
