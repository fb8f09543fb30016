"""What the trace says about a pass that raised: the exception, the node it was at, and the line.

A pass that raises something other than a user error (a ``MirserveError``) has a bug, or met a model it was
not written for. The manager undoes its edits and goes on without it (unless the run is strict); this module
only describes the failure for the trace, the warnings and the strict error. "The node it was at" is the
node the failing code was working on: a ``node`` an exception carries (the filter engine sets it), else the
innermost frame's local called ``node``, else any node a frame of the pass holds, else the last node the pass
changed before it failed.
"""
from __future__ import annotations

import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import worker
from worker.engine.errors import InternalError
from worker.engine.ir import Node

#: Frames from these directories (Python's own library, installed packages) are not where a pass failed,
#: unless they are the engine's own (installed as a package, it lives among them).
_LIBRARIES = tuple(str(Path(sysconfig.get_paths()[key]).resolve()) for key in ("stdlib", "purelib", "platlib"))
_ENGINE = str(Path(worker.__file__).resolve().parent)


@dataclass(frozen=True)
class PassFailure:
    pass_name: str
    origin: str
    error: str                  # "ValueError: ..." (the exception's type and message)
    node: str | None = None
    op: str | None = None
    where: str | None = None    # "file.py:42": the innermost line of the pass's own code

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error, "node": self.node, "op": self.op, "where": self.where}

    @property
    def message(self) -> str:
        """One sentence for the user: which pass, what it raised, and where."""
        at = []
        if self.node is not None:
            at.append(f"at node {self.node} ({self.op})")
        if self.where is not None:
            at.append(self.where)
        origin = "" if self.origin == "built-in" else f" from {self.origin}"
        return f"pass {self.pass_name!r}{origin} failed: {self.error}" + (f" ({', '.join(at)})" if at else "")


def describe(pass_name: str, origin: str, exc: BaseException, last_node: Node | None = None) -> PassFailure:
    frames = list(traceback.walk_tb(exc.__traceback__))
    node = getattr(exc, "node", None)
    if not isinstance(node, Node):
        node = _node_in(frames) or last_node
    text = str(exc).splitlines()[0] if str(exc) else ""
    if not isinstance(exc, InternalError):  # an InternalError's message already names what went wrong
        text = f"{type(exc).__name__}: {text}".rstrip(": ")
    op = None if node is None else (f"{node.domain}.{node.op_type}" if node.domain else node.op_type)
    return PassFailure(pass_name, origin, text, None if node is None else node.name, op, _where(frames))


def _node_in(frames) -> Node | None:
    for frame, _ in reversed(frames):
        found = frame.f_locals.get("node")
        if isinstance(found, Node):
            return found
    for frame, _ in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, Node):
                return value
    return None


def _where(frames) -> str | None:
    """``worker/engine/....py:42`` for the engine's own code, ``file.py:42`` for a plugin's: never a path of
    the machine the engine runs on (a service's warnings go to its clients)."""
    for frame, line in reversed(frames):
        path = str(Path(frame.f_code.co_filename).resolve())
        if path.startswith(_ENGINE):
            return f"{Path(path).relative_to(Path(_ENGINE).parent.parent).as_posix()}:{line}"
        if not path.startswith(_LIBRARIES):
            return f"{Path(path).name}:{line}"
    return None
