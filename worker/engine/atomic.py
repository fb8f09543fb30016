"""Atomic file publication: write a temporary file beside the target, then rename it into place.

A reader never sees half a file, and a failure leaves nothing behind. The temporary file gets the mode a plain
``open()`` would give (mkstemp's 0600 would make outputs unreadable to the service's other users).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory; on normal exit it replaces ``path``."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, data) -> None:
    import json

    with atomic_path(path) as tmp, open(tmp, "w") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
