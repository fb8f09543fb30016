"""The one function the job child calls: the engine's public entry point, fed from a job's spec.

Jobs store their spec as the JSON the API validated; this adapter turns it back into ``OptimizeOptions``.
Tests of the job machinery swap this reference (``MIRSERVE_ENGINE``, ``JobSettings.engine``) for a small
function with the same signature; everything else about a job (child process, limits, lease, publish) stays.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

#: Each verification child (choosing shapes, comparing) may take this share of the job's time limit.
VERIFY_TIME_SHARE = 1 / 6


def run_optimize(model_path: str, output_path: str, options: Mapping[str, Any],
                 progress: Callable[[int, int, str], None], external_data_dir: str | None = None) -> dict:
    """``external_data_dir`` is given only for a model unpacked from an archive upload: the directory it was
    unpacked in, the one place its external data may be read from."""
    from dataclasses import replace

    from worker.engine.api import OptimizeOptions, optimize

    engine_options = OptimizeOptions.from_dict(options)
    engine_options = replace(engine_options, limits=job_limits(engine_options.limits))
    return optimize(model_path, output_path, engine_options, progress=progress,
                    external_data_dir=external_data_dir)


def job_limits(limits):
    """The engine's default limits, with verification's budgets taken from the job's own: a share of its time
    limit, and its memory limit (the verification child is a process of its own under the same cap)."""
    from dataclasses import replace

    from worker.jobs.config import JobSettings

    settings = JobSettings()
    return replace(limits, verify_seconds=max(1.0, settings.job_time_limit_seconds * VERIFY_TIME_SHARE),
                   verify_memory_mb=settings.job_memory_mb or limits.verify_memory_mb)
