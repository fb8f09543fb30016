"""A fork server for verification children: onnxruntime, numpy and onnx imported once, a fresh fork per check.

Every numeric check runs in a child (``numeric._run_child``), so a model that crashes the runtime or eats all
memory takes the child down, not the engine. A new Python that imports onnxruntime, numpy and onnx costs about
half a second of CPU, and auto mixed precision and the tests start hundreds of them. The server is started
once per engine process, on its first check, with those modules imported and nothing else of note; each check
is a fresh fork of it that runs that one check and exits, so nothing of one model is left for the next. The
server never runs a model itself: onnxruntime makes its thread pools with a session, and forking a process
that has them running is not safe. It does make one session before it serves (``numeric.warm_up``), with one
intra-op and one inter-op thread, which start no thread, so that each check does not pay for onnxruntime's
environment and kernel registry and numpy's lazily loaded pieces again (a check of a two-node model: 28 ms ->
16 ms). What the imports start is idle when the server forks: onnxruntime's one thread waits on a timed
condition (it wakes every few seconds, holding its lock for microseconds), and OpenBLAS stops its threads
before each fork (its own fork handler) and the server makes no BLAS call to start them again; a fork takes
only the forking thread along.

A forked child keeps what the subprocess it replaces had: its stdin, stdout and stderr are pipes the caller
gives it (over a Unix socket); its address-space limit is set in the child before it reads its request; the
caller kills the child (never the server) through a pidfd when its time is up; it dies with its parent, the
server, which dies with the engine process (``children.die_with_parent``) and leaves when the engine closes
its socket. It runs in the caller's working directory and environment of the moment. When the server cannot
be used (no fork, it will not start, it died, another thread is using it), the caller runs the check in a
subprocess as before (``run`` returns None). The kernel's parent-death signal follows the thread that started
the server: the engine process and the command line verify from their main thread; a server started from a
thread that ends dies with it, and the next check starts another. ``MIRSERVE_FORKSERVER=0`` turns it off.
"""
from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

#: How long a new server may take to import what it preloads before the engine gives up on it.
START_SECONDS = 60
#: After this many servers that would not start, the engine process stops starting them.
MAX_STARTS_FAILED = 3
#: The largest control message (a working directory and an environment).
MESSAGE_BYTES = 1 << 20
#: The command a TimeoutExpired names once the child it timed out was killed and reaped (the server is in step).
KILLED = "killed"


class ServerGone(Exception):
    """The server stopped answering; the check it was running did not finish there."""


@dataclass
class Finished:
    """What a forked child left: like ``subprocess.CompletedProcess`` (a signal's death is its negative)."""

    returncode: int
    stdout: str
    stderr: str


class ForkServer:
    """The engine's side of one server: its process and the socket to it, one check at a time."""

    def __init__(self) -> None:
        parent_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.owner = os.getpid()
        self.busy = threading.Lock()
        self.served = 0  # children forked, run and reaped
        self.socket = parent_end
        # Its stdin at its end, its output to a pipe nobody reads: not /dev/null, which a sandbox (Landlock in
        # the job's engine process) may not let it open; not the engine's own stdio, which it would hold open.
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        os.close(stdin_w)
        os.close(out_r)
        with server_end:
            try:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "worker.engine.forkserver", str(server_end.fileno()), str(os.getpid())],
                    pass_fds=[server_end.fileno()], stdin=stdin_r, stdout=out_w, stderr=out_w,
                    env={**os.environ, "ORT_LOGGING_LEVEL": "3"})
            finally:
                os.close(stdin_r)
                os.close(out_w)
        try:
            self._receive(time.monotonic() + START_SECONDS)  # {"ready": pid}: it imported what it preloads
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self.process.poll() is None

    def run(self, request: str, *, address_space: int, timeout: float, env: dict) -> Finished:
        """Run one check in a fresh fork: ``request`` on its stdin, its stdout and stderr returned.

        Raises ``subprocess.TimeoutExpired`` after killing the child when ``timeout`` runs out, and
        ServerGone (after closing this server) when the server stops answering."""
        deadline = time.monotonic() + timeout
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        ours = [stdin_w, stdout_r, stderr_r]  # _exchange closes stdin when written and marks it None
        message = {"cwd": os.getcwd(), "env": env, "address_space": address_space}
        try:
            try:
                socket.send_fds(self.socket, [json.dumps(message).encode()], [stdin_r, stdout_w, stderr_w])
            finally:
                for fd in (stdin_r, stdout_w, stderr_w):
                    os.close(fd)
            started, fds = self._receive(deadline, with_fds=True)
            pidfd = fds[0] if fds else None
            try:
                return self._finish(started["pid"], pidfd, request.encode(), ours, deadline, timeout)
            finally:
                if pidfd is not None:
                    os.close(pidfd)
        except ServerGone:
            raise
        except subprocess.TimeoutExpired as exc:
            if exc.cmd != KILLED:  # it ran out before the child started or was reaped: the socket is out of step
                self.close()
            raise subprocess.TimeoutExpired("numeric verification", timeout) from None
        except BaseException as exc:  # the socket's state is unknown: this server is done
            self.close()
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise ServerGone(str(exc)) from exc
            raise
        finally:
            for fd in ours:
                if fd is not None:
                    os.close(fd)

    def _finish(self, pid: int, pidfd: int | None, data: bytes, ours: list, deadline: float,
                timeout: float) -> Finished:
        try:
            out, err = _exchange(data, ours, deadline)
            ended = self._receive(deadline)
        except subprocess.TimeoutExpired:
            _kill(pid, pidfd)
            try:
                self._receive(time.monotonic() + 10)  # the server reaped it: the socket is in step again
            except (subprocess.TimeoutExpired, ServerGone):
                raise subprocess.TimeoutExpired("numeric verification", timeout) from None
            raise subprocess.TimeoutExpired(KILLED, timeout) from None
        if ended.get("pid") != pid:
            raise ServerGone(f"the server answered for process {ended.get('pid')}, not {pid}")
        self.served += 1
        return Finished(ended["returncode"], out.decode(errors="replace"), err.decode(errors="replace"))

    def _receive(self, deadline: float, *, with_fds: bool = False):
        """The server's next message (and the descriptors it carries, with ``with_fds``)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired("numeric verification", 0)
        self.socket.settimeout(left)
        try:
            data, fds, _, _ = socket.recv_fds(self.socket, MESSAGE_BYTES, 1)
        except socket.timeout:
            raise subprocess.TimeoutExpired("numeric verification", 0) from None
        except OSError as exc:
            self.close()
            raise ServerGone(f"the fork server's socket failed: {exc}") from None
        if not data:
            for fd in fds:
                os.close(fd)
            self.close()
            raise ServerGone("the fork server exited")
        message = json.loads(data)
        if with_fds:
            return message, fds
        for fd in fds:
            os.close(fd)
        return message

    def close(self) -> None:
        """Close the socket (the server leaves when it reads that) and reap the server."""
        self.socket.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _exchange(data: bytes, ours: list, deadline: float) -> tuple[bytes, bytes]:
    """Write ``data`` to the child's stdin and read its stdout and stderr to their ends, before ``deadline``.

    ``ours`` holds the caller's ends of the pipes (stdin, stdout, stderr); stdin is closed when written (the
    child reads to its end) and set to None."""
    stdin_w, stdout_r, stderr_r = ours
    read: dict[int, list] = {stdout_r: [], stderr_r: []}
    with selectors.DefaultSelector() as selector:
        os.set_blocking(stdin_w, False)
        selector.register(stdin_w, selectors.EVENT_WRITE)
        for fd in read:
            selector.register(fd, selectors.EVENT_READ)
        sent = 0
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("numeric verification", 0)
            for key, _ in selector.select(left):
                if key.fd == stdin_w:
                    try:
                        sent += os.write(stdin_w, data[sent:sent + 65536])
                    except BrokenPipeError:  # the child stopped reading: what it says tells why
                        sent = len(data)
                    if sent >= len(data):
                        selector.unregister(stdin_w)
                        os.close(stdin_w)
                        ours[0] = None
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    read[key.fd].append(chunk)
                else:
                    selector.unregister(key.fd)
    return b"".join(read[stdout_r]), b"".join(read[stderr_r])


def _kill(pid: int, pidfd: int | None) -> None:
    """SIGKILL the child; by its pidfd, so a pid reused after the server reaped it is never hit."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# The engine's server, made on its first check; a forked engine process makes its own.
_server: ForkServer | None = None
_starting = threading.Lock()
_starts_failed = 0


def usable() -> bool:
    """Whether this platform can fork children from a server (Linux: fork, pidfds, descriptor passing)."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(socket, "send_fds")
            and hasattr(os, "pidfd_open") and os.environ.get("MIRSERVE_FORKSERVER", "1") != "0")


def _get() -> ForkServer | None:
    """The running server, started (again) if it is not running; None when it cannot be had."""
    global _server, _starts_failed
    with _starting:
        if _server is not None and _server.alive():
            return _server
        if _server is not None:  # it died (killed, or the thread that started it ended): start another
            _server.close()
            _server = None
        if _starts_failed >= MAX_STARTS_FAILED or not usable():
            return None
        try:
            _server = ForkServer()
        except Exception:  # noqa: BLE001 - the subprocess path stays
            _starts_failed += 1
            return None
        return _server


def run(request: str, *, address_space: int, timeout: float, env: dict) -> Finished | None:
    """Run one check in a fresh fork of the engine's server; None when the server cannot run it (the caller
    then starts a subprocess). Raises ``subprocess.TimeoutExpired`` when the check overruns ``timeout``."""
    server = _get()
    if server is None or not server.busy.acquire(blocking=False):
        return None
    try:
        return server.run(request, address_space=address_space, timeout=timeout, env=env)
    except ServerGone:
        return None
    finally:
        server.busy.release()


def current() -> ForkServer | None:
    """This process's server, if one was started (alive or not)."""
    return _server if _server is not None and _server.owner == os.getpid() else None


def stop() -> None:
    """Close this process's server; the next check starts another."""
    global _server
    with _starting:
        if current() is not None:
            _server.close()
        _server = None


def _forget_after_fork() -> None:
    """In a forked engine process, the parent's server (and a lock some thread held) are not ours."""
    global _server, _starting
    _server, _starting = None, threading.Lock()


def _close_at_exit() -> None:
    """Let the server go and reap it, so its CPU time (and its children's) is counted to this process."""
    if current() is not None:
        _server.close()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(_close_at_exit)


# --- the server process ---------------------------------------------------------------------------------

def _preload() -> None:
    """What every check imports, and the warm-up of what it builds on first use; nothing here starts a thread
    (the warm-up's onnxruntime session has no thread pool)."""
    import numpy  # noqa: F401
    import numpy.random  # noqa: F401  (numpy loads it on first use: 14 ms of every check's child)
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    import worker.engine.children  # noqa: F401
    import worker.engine.numeric
    import worker.engine.sample_shapes  # noqa: F401

    worker.engine.numeric.warm_up()


def _serve(channel: socket.socket) -> None:
    """Fork one child per request, answer its pid (and pidfd), then its exit status; until the engine leaves."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(channel, MESSAGE_BYTES, 3)
        except OSError:
            return
        if not data:  # the engine closed its end
            return
        message = json.loads(data)
        pid = os.fork()
        if pid == 0:
            _child(channel, message, fds)  # never returns
        for fd in fds:
            os.close(fd)
        try:
            pidfds = [os.pidfd_open(pid)]
        except OSError:  # a kernel without pidfds (before 5.3): the engine kills by pid
            pidfds = []
        try:
            socket.send_fds(channel, [json.dumps({"pid": pid}).encode()], pidfds)
        except OSError:
            return  # the engine is gone; the child dies with this server
        finally:
            for fd in pidfds:
                os.close(fd)
        _, status = os.waitpid(pid, 0)
        try:
            channel.send(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())
        except OSError:
            return


def _child(channel: socket.socket, message: dict, fds: list) -> None:
    """In the forked child: take the caller's pipes, directory, environment and address-space limit, run the
    check as ``python -m worker.engine.numeric`` would, and exit."""
    code = 1
    try:
        server_pid = os.getppid()
        channel.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(message["cwd"])
        os.environ.clear()
        os.environ.update(message["env"])
        from worker.engine import numeric

        numeric.limit_address_space(message["address_space"])
        numeric.main(parent_pid=server_pid)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - told on stderr, as an uncaught error in a subprocess is
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def main() -> None:
    from worker.engine.children import die_with_parent

    channel = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the engine, and this server with it
    if not die_with_parent(int(sys.argv[2])):
        sys.exit(1)
    _preload()
    channel.send(json.dumps({"ready": os.getpid()}).encode())
    _serve(channel)


if __name__ == "__main__":
    main()
