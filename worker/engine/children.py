"""Child processes that never outlive their parent.

The engine runs untrusted models in children (the job runner's engine process, numeric verification); a
child left behind by a killed parent would hold memory and CPU until its own timeout. On Linux the kernel
signals the child when its parent dies (PR_SET_PDEATHSIG); a child whose parent died before that request took
effect learns it from its parent pid.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies; False if the parent is gone already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return os.getppid() == parent_pid
