"""The result cache: a new job whose model and spec an earlier job already optimized, with the same engine,
reuses that job's artifact instead of running.

A result is named by its *cache key*: the sha256 of the input model's sha256, the job's places and engine
options (``JobSpec.fingerprint``) and the identity of the engine that produced it (``engine_identity``: the
mirserve version and every plugin found, by file name and content digest or entry point, with what it
registered). The engine process records the identity it ran with in its verdict, so a succeeded job's key
names the engine that really made its artifact; the API computes the key of a submission with its own
identity and looks for a succeeded job with that key (``JobStore.find_cached``). A hit becomes a job of its
own, succeeded at once, with its own copies of the source's model and report (``reuse_result``): deleting the source
later does not touch it. A job opts out with the option ``cache=false``, a deployment with
``MIRSERVE_CACHE=0``.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from worker.jobs.files import CACHED_ATTEMPT, JobFiles
from worker.jobs.spec import JobSpec
from worker.jobs.storage import ObjectMissing


@functools.lru_cache(maxsize=1)
def engine_identity() -> dict[str, Any]:
    """What, besides the model and the spec, decides an engine's output: its version and its plugin set.

    Computed once per process (plugins load once per process). Paths differ between hosts, so a plugin file
    is named by its file name and the digest of its content.
    """
    from worker.engine.api import __version__, list_plugins

    plugins = []
    for plugin in list_plugins():
        origin = str(plugin.get("origin"))
        path = Path(origin)
        if path.is_file():
            origin = f"{path.name}@sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
        plugins.append({"origin": origin, "status": plugin.get("status"), "provides": plugin.get("provides")})
    plugins.sort(key=lambda p: json.dumps(p, sort_keys=True))
    return {"version": __version__, "plugins": plugins}


def cache_key(input_sha256: str, spec: JobSpec, identity: Mapping[str, Any]) -> str:
    """The name of the result of ``spec`` applied to the model with ``input_sha256`` by that engine."""
    text = json.dumps({"request": spec.fingerprint(input_sha256), "engine": identity}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def reuse_result(files: JobFiles, source_id: str, source_attempt: int, job_id: str) -> bool:
    """Copy the source job's published outputs to ``job_id``'s own cached attempt; False (and nothing left
    behind) when some are gone, as when the source was deleted meanwhile."""
    storage = files.storage
    copies = [(files.report_key, True), (files.log_key, False), (files.artifact_data_key, False),
              (files.artifact_key, True)]  # the model last: with it, everything is in place
    try:
        for key, required in copies:
            source = key(source_id, source_attempt)
            if not required and not storage.exists(source):
                continue
            storage.copy(source, key(job_id, CACHED_ATTEMPT))
    except ObjectMissing:
        storage.delete_prefix(files.attempt_prefix(job_id, CACHED_ATTEMPT))
        return False
    return True
