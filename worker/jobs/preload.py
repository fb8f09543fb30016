"""What the fork server imports before any job (``worker.jobs.engine_process``): importing this module is the
warm-up. The engine, its registries and the operator's plugins load once per worker process, and every job's
engine process is forked from that state instead of importing them again (about half a second and 50 MB of
work per job otherwise). So do what every job would otherwise do first: read the job settings' module
(pydantic-settings, about 0.2 s) and every target's kernel table (about 0.15 s on a first lookup).

onnxruntime is not imported here: it starts a thread at import, and a process forked from one that has other
threads may inherit a lock held by a thread that does not exist in it.
"""
from __future__ import annotations

import worker.jobs.child  # noqa: F401 - the engine process's own code
import worker.jobs.config  # noqa: F401 - read by every job for its verification budgets
from worker.engine.api import list_plugins, list_targets

from worker.jobs.result_cache import engine_identity

try:
    list_plugins()  # loads them; one that fails is recorded with its error, as it would be in a job
    engine_identity()  # and what a job's verdict names as the engine that made its result
    list_targets()  # reads every kernel table (plugins' kernels included), shared by every forked job
except Exception:  # noqa: BLE001 - a broken plugin set must not stop the fork server; jobs report it
    pass
