"""What the engine process may see of the file system: its attempt directory, its input, and the code it runs.

The engine reads untrusted models, so besides refusing every file a model names (``worker.engine.ir.tensors``)
the process itself is fenced in, so that a bug in a parser or a runtime cannot reach server files either:

- it starts in its attempt directory, with ``HOME`` and ``TMPDIR`` inside it, so a relative name or a runtime
  cache (onnxruntime writes under ``~/.cache`` and ``$TMPDIR``) lands there and nowhere else;
- where the kernel offers Landlock (Linux 5.13 and later), the process and every child it starts (numeric
  verification) may read only the Python installation, the import path, the system libraries and the plugin
  files, may read its input model, and may write only in its attempt directory. The data directory (the job
  table, other jobs, uploads) stays out of reach even where it lies inside an allowed directory, such as a
  checkout's ``./data``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable

#: System paths the interpreter and the runtimes need: shared libraries, the dynamic linker's cache, CPU facts.
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime", "/proc/cpuinfo",
               "/proc/meminfo", "/proc/self", "/sys/devices/system/cpu", "/sys/fs/cgroup", "/dev/null",
               "/dev/urandom")


def private_environment(env: dict[str, str], attempt_dir: Path) -> dict[str, str]:
    """``env`` with HOME and TMPDIR inside the attempt directory (created here)."""
    home, tmp = attempt_dir / "home", attempt_dir / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(home / ".cache")}


def landlock_version() -> int:
    """The kernel's Landlock ABI version, 0 where there is none."""
    try:
        import landlock

        return int(landlock.landlock_abi_version())
    except Exception:  # noqa: BLE001 - not Linux, an old kernel, or Landlock disabled at boot
        return 0


def restrict(*, model: Path, attempt_dir: Path, hidden: Path, extra_read: Iterable[str] = ()) -> str:
    """Fence this process in (see the module docstring); returns what was done, for the engine log."""
    version = landlock_version()
    if version == 0:
        return "no Landlock in this kernel: the engine process is not fenced in beyond its working directory"
    import landlock
    from landlock import FSAccess

    read_dir = FSAccess.READ_FILE | FSAccess.READ_DIR | FSAccess.EXECUTE
    ruleset = landlock.Ruleset()
    hidden = hidden.resolve()
    roots = [*SYSTEM_READ, sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), *sys.path, *extra_read]
    for root in dict.fromkeys(os.path.abspath(r) for r in roots if r):
        _allow_except(ruleset, Path(root), hidden, read_dir)
    _allow(ruleset, model, FSAccess.READ_FILE)
    ruleset.allow(str(attempt_dir), rules=FSAccess.all())
    ruleset.apply()
    return f"Landlock ABI {version}: reads limited to the code and the input model, writes to the attempt directory"


def _allow_except(ruleset, root: Path, hidden: Path, rights) -> None:
    """Allow ``root``, except anything at or below ``hidden`` (Landlock cannot subtract: allow the siblings)."""
    if not root.exists():
        return
    real = root.resolve()
    if real == hidden or hidden in real.parents:
        return
    if real not in hidden.parents:
        _allow(ruleset, root, rights)
        return
    for entry in os.scandir(real):
        _allow_except(ruleset, Path(entry.path), hidden, rights)


def _allow(ruleset, path: Path, rights) -> None:
    from landlock import FSAccess

    if not path.is_dir():  # a file takes file rights only
        rights &= FSAccess.READ_FILE | FSAccess.EXECUTE | FSAccess.WRITE_FILE | FSAccess.TRUNCATE
    try:
        ruleset.allow(str(path), rules=rights)
    except OSError:
        pass  # vanished, or a special file Landlock cannot take a rule on: it simply stays unreachable
