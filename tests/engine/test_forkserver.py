"""Verification children forked from one server keep what a new Python had: their own memory limit, the
timeout, the same sentences for a crash, no server or child left when the engine dies, and the subprocess path
when the server is gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnx
import pytest

from worker.engine import forkserver
from worker.engine.errors import VerificationError
from worker.engine.numeric import verify

REPO = Path(__file__).resolve().parents[2]
HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
RELU = "g (float[2,3] x) => (float[2,3] y) { y = Relu(x) }"
#: 1 GiB made at run time from a 16-byte shape.
FILL = """g (float[1,16384] x) => (float[1,16384] y) {
  sh = Constant<value = int64[2] {16384, 16384}>()
  w = ConstantOfShape<value = float[1] {0.5}>(sh)
  y = MatMul(x, w)
}"""
#: Runs until it is killed: the condition stays true and the trip count is 2^62.
FOREVER = """g (float[1] x) => (float[1] y) {
  m = Constant<value = int64 {4611686018427387904}>()
  c = Constant<value = bool {1}>()
  y = Loop(m, c, x) <body = b (int64 i, bool ci, float[1] a) => (bool co, float[1] an) {
      z = Constant<value = int64 {-1}>()
      co = Greater(i, z)
      an = Identity(a)
  }>
}"""


def model_file(directory: Path, text: str, name: str) -> str:
    path = directory / name
    onnx.save(onnx.parser.parse_model(HEADER + text), str(path))
    return str(path)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        return [int(p) for p in listed.read().split()]


def wait_until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def served() -> int:
    server = forkserver.current()
    return server.served if server is not None and server.alive() else 0


pytestmark = pytest.mark.skipif(not forkserver.usable(), reason="no fork server on this platform")


def test_checks_run_in_fresh_forks_of_one_server(tmp_path):
    relu = model_file(tmp_path, RELU, "relu.onnx")
    assert verify(relu, relu)["passed"] is True
    server = forkserver.current()
    before = server.served
    assert verify(relu, relu, memory_mb=2048)["passed"] is True
    assert forkserver.current() is server and server.served == before + 1 and children(server.process.pid) == []


def test_a_forked_child_is_held_to_its_memory_budget(tmp_path):
    fill = model_file(tmp_path, FILL, "fill.onnx")
    verify(model_file(tmp_path, RELU, "relu.onnx"), model_file(tmp_path, RELU, "relu.onnx"))
    before = served()
    with pytest.raises(VerificationError) as caught:
        verify(fill, fill, memory_mb=600)
    assert str(caught.value) == ("numeric verification needed more memory than its budget of 600 MiB (limit "
                                 "verify_memory_mb; raise it with --limit verify_memory_mb=N)")
    assert served() == before + 1  # in a fork, not a fallback; the server lives on


def test_a_forked_child_that_overruns_its_time_is_killed_and_the_server_lives_on(tmp_path):
    forever = model_file(tmp_path, FOREVER, "forever.onnx")
    relu = model_file(tmp_path, RELU, "relu.onnx")
    verify(relu, relu)
    server, started = forkserver.current(), time.monotonic()
    with pytest.raises(VerificationError) as caught:
        verify(forever, forever, timeout=1)
    assert str(caught.value) == ("numeric verification did not finish within its budget of 1 s (limit "
                                 "verify_seconds; raise it with --limit verify_seconds=N)")
    assert time.monotonic() - started < 10
    assert forkserver.current() is server and server.alive() and children(server.process.pid) == []
    assert verify(relu, relu)["passed"] is True


def test_a_child_killed_by_a_signal_is_reported_as_a_crash(tmp_path):
    forever = model_file(tmp_path, FOREVER, "forever.onnx")
    relu = model_file(tmp_path, RELU, "relu.onnx")
    verify(relu, relu)
    server = forkserver.current().process.pid
    errors = []
    thread = threading.Thread(target=lambda: _catch(errors, verify, forever, forever, timeout=60))
    thread.start()
    assert wait_until(lambda: children(server) != [])
    os.kill(children(server)[0], signal.SIGSEGV)
    thread.join(30)
    assert [str(e) for e in errors] == ["numeric verification crashed: exit status -11"]


def test_relative_paths_are_read_from_the_callers_directory_of_the_moment(tmp_path, monkeypatch):
    model_file(tmp_path, RELU, "relu.onnx")
    verify(model_file(tmp_path, RELU, "other.onnx"), str(tmp_path / "other.onnx"))  # the server is running
    monkeypatch.chdir(tmp_path)
    assert verify("relu.onnx", "relu.onnx")["passed"] is True


def test_a_killed_server_is_replaced_and_a_check_it_was_running_reruns_in_a_subprocess(tmp_path):
    relu = model_file(tmp_path, RELU, "relu.onnx")
    forever = model_file(tmp_path, FOREVER, "forever.onnx")
    verify(relu, relu)
    server = forkserver.current()
    first = server.process.pid
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: server.process.poll() is not None)  # all its threads gone, not only the first
    assert verify(relu, relu)["passed"] is True
    second = forkserver.current().process.pid
    assert second != first and served() == 1

    errors, started = [], time.monotonic()
    thread = threading.Thread(target=lambda: _catch(errors, verify, forever, forever, timeout=1))
    thread.start()
    assert wait_until(lambda: children(second) != [])
    child = children(second)[0]
    os.kill(second, signal.SIGKILL)
    assert wait_until(lambda: not alive(child), 5)  # it died with its server
    thread.join(30)
    assert [str(e) for e in errors] == ["numeric verification did not finish within its budget of 1 s (limit "
                                        "verify_seconds; raise it with --limit verify_seconds=N)"]
    assert time.monotonic() - started >= 1  # the subprocess ran it again, with its whole budget


def test_the_server_starts_where_dev_null_cannot_be_opened(tmp_path, monkeypatch):
    """The job's engine process runs under Landlock, which does not let it open /dev/null."""
    relu = model_file(tmp_path, RELU, "relu.onnx")
    forkserver.stop()
    monkeypatch.setattr(os, "devnull", str(tmp_path / "no" / "null"))
    assert verify(relu, relu)["passed"] is True
    assert served() == 1


def test_without_a_server_checks_run_in_subprocesses(tmp_path, monkeypatch):
    relu = model_file(tmp_path, RELU, "relu.onnx")
    forkserver.stop()
    monkeypatch.setenv("MIRSERVE_FORKSERVER", "0")
    assert verify(relu, relu)["passed"] is True
    assert forkserver.current() is None


def test_two_threads_verify_at_once(tmp_path):
    relu = model_file(tmp_path, RELU, "relu.onnx")
    results, errors = [], []
    threads = [threading.Thread(target=lambda: _catch(errors, lambda: results.append(verify(relu, relu))))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and [r["passed"] for r in results] == [True, True]


ENGINE = r"""
import sys
from worker.engine import forkserver
from worker.engine.numeric import verify
verify(sys.argv[1], sys.argv[1])
print(forkserver.current().process.pid, flush=True)
verify(sys.argv[2], sys.argv[2], timeout=120)
"""


def test_no_server_or_child_outlives_a_killed_engine(tmp_path):
    relu = model_file(tmp_path, RELU, "relu.onnx")
    forever = model_file(tmp_path, FOREVER, "forever.onnx")
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, relu, forever], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    server = int(engine.stdout.readline())
    assert wait_until(lambda: children(server) != [])
    child = children(server)[0]
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    try:
        assert wait_until(lambda: not alive(server) and not alive(child), 5)
    finally:  # leave nothing running when it fails
        for pid in (child, server):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_server_leaves_when_the_engine_exits(tmp_path):
    relu = model_file(tmp_path, RELU, "relu.onnx")
    code = ENGINE.rsplit("\n", 2)[0]  # without the endless check
    engine = subprocess.run([sys.executable, "-c", code, relu, relu], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert engine.returncode == 0, engine.stderr
    assert not alive(int(engine.stdout))  # reaped by the engine at its exit, not left to init


def _catch(errors: list, function, *args, **kwargs) -> None:
    try:
        function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test reads it
        errors.append(exc)


def test_the_servers_warm_up_starts_no_thread():
    """The server pays onnxruntime's first session and numpy's lazy pieces before it forks; a thread running in
    it would make forking unsafe, so the warm-up must leave the thread count as the imports left it."""
    script = ("import os, numpy, numpy.random, onnx, onnxruntime, worker.engine.numeric as n\n"
              "count = lambda: len(os.listdir('/proc/self/task'))\n"
              "before = count(); n.warm_up(); print(before, count())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert after == before
