"""Small engine functions for testing the job machinery (child process, lease, publish) without the optimizer.

Each has the signature of ``worker.jobs.engine.run_optimize``; its behaviour is chosen by the job's options,
which tests write straight into the job table (the API would reject these keys).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

from worker.engine.errors import ModelError


def scripted(model_path, output_path, options, progress, external_data_dir=None):
    """Copy the model through ``passes`` fake passes, then do what ``options["then"]`` says.

    With ``hold``, the first pass lasts until the test sends the engine process SIGUSR1 (``release``), at
    most ``hold`` seconds: a job that is surely running while the test strikes, for exactly as long as the
    test needs it, instead of a guessed ``pass_seconds``."""
    passes = int(options.get("passes", 3))
    released = _released_by_sigusr1() if options.get("hold") else None
    for index in range(passes):
        progress(index + 1, passes, f"fake_pass_{index + 1}")
        if index == 0 and released is not None:
            deadline = time.monotonic() + float(options["hold"])
            while not released and time.monotonic() < deadline:
                time.sleep(0.01)  # short naps: the handler runs in this (the main) thread between them
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
    if options.get("record_process"):  # which process ran the job, and what it had loaded before
        record("process", {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                           "engine_loaded": "worker.engine.passes" in sys.modules})
    if then == "probe":  # what it found goes to its log: the published report names no server path
        record("probe", probe(options))
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
    if options.get("open_dims"):  # a model whose input dim 'batch' is open: its memory as formulas of it
        fit = {"formula": "1024*batch", "terms": [[1024, {"batch": 1}]]}
        report["memory"]["symbolic"] = {"dims": ["batch"], "base": {"batch": 1},
                                        "spaces": {"host": {"arena_bytes": fit, "peak_bytes": fit}},
                                        "io_bytes": {"formula": "16*batch", "terms": [[16, {"batch": 1}]]},
                                        "planned_at": [{"batch": 1}, {"batch": 2}], "checked_at": [{"batch": 3}]}
    return report


def _released_by_sigusr1() -> list:
    """A list that becomes non-empty when this process gets SIGUSR1 (installed before the first progress
    report, so that a test that waits for that report cannot signal too early)."""
    import signal

    released = []
    signal.signal(signal.SIGUSR1, lambda *_: released.append(True))
    return released


def release(pid: int) -> None:
    """Let a job submitted with ``hold`` go on past its first pass (``pid``: its engine process)."""
    import signal

    os.kill(pid, signal.SIGUSR1)


def record(name: str, data: dict) -> None:
    """A line of the engine log (which the runner keeps with the attempt) that ``recorded`` finds."""
    print(f"RECORD {name} {json.dumps(data)}", flush=True)


def recorded(log: bytes, name: str) -> dict:
    for line in log.decode().splitlines():
        if line.startswith(f"RECORD {name} "):
            return json.loads(line[len(f"RECORD {name} "):])
    raise AssertionError(f"no {name} record in the engine log:\n{log.decode()[-2000:]}")


def probe(options) -> dict:
    """What this process (and a child it starts, as verification does) can reach of the file system."""
    import subprocess
    import sys

    def attempt(action, path):
        try:
            action(path)
            return "ok"
        except OSError as error:
            return type(error).__name__

    def write(path):
        with open(path, "wb") as handle:
            handle.write(b"x")

    found = {"cwd": os.getcwd(), "home": os.environ.get("HOME"), "tmpdir": os.environ.get("TMPDIR"),
             "relative": os.path.abspath("relative.txt"),
             "read": {p: attempt(lambda q: open(q, "rb").read(1), p) for p in options.get("probe_read", [])},
             "write": {p: attempt(write, p) for p in options.get("probe_write", [])},
             "list": {p: attempt(os.listdir, p) for p in options.get("probe_list", [])}}
    script = ("import sys\ntry:\n    open(sys.argv[1], 'rb').read(1); print('ok')\n"
              "except OSError as e:\n    print(type(e).__name__)")
    found["child_read"] = {p: subprocess.run([sys.executable, "-c", script, p], capture_output=True,
                                             text=True).stdout.strip() for p in options.get("probe_read", [])}
    return found


def slow_optimize(model_path, output_path, options, progress):
    """The real engine, held back ``MIRSERVE_TEST_ENGINE_DELAY`` seconds at its first pass and
    ``MIRSERVE_TEST_PASS_DELAY`` seconds at every pass.

    Kill tests need a job that is surely mid-run when they strike, and progress tests a job whose passes
    last longer than a poll; the optimization itself is the real one.
    """
    from worker.jobs.engine import run_optimize

    delay = float(os.environ.get("MIRSERVE_TEST_ENGINE_DELAY", "0"))
    per_pass = float(os.environ.get("MIRSERVE_TEST_PASS_DELAY", "0"))
    state = {"slept": False}

    def slow_progress(index, total, pass_name):
        progress(index, total, pass_name)
        time.sleep(per_pass)
        if not state["slept"]:
            state["slept"] = True
            time.sleep(delay)

    return run_optimize(model_path, output_path, options, slow_progress)


def delayed(model_path, output_path, options, progress):
    """``scripted`` after ``MIRSERVE_TEST_ENGINE_DELAY`` seconds: a job that is surely running for a while, on
    options the API accepts (for tests that submit over HTTP and strike mid-run)."""
    progress(0, 1, "delay")
    time.sleep(float(os.environ.get("MIRSERVE_TEST_ENGINE_DELAY", "0")))
    return scripted(model_path, output_path, options, progress)


def main_module(model_path, output_path, options, progress, external_data_dir=None):
    """``scripted``, and the file of the main module this process has (``multiprocessing`` names the parent's
    ``__main__`` ``__mp_main__`` when it imports it again; the fork server's own has no file)."""
    report = scripted(model_path, output_path, options, progress)
    report["main_file"] = getattr(sys.modules.get("__mp_main__"), "__file__", None)
    return report
