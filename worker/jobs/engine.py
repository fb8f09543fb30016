"""The one function the job child calls: the engine's public entry point, fed from a job's spec.

Jobs store their spec as the JSON the API validated; this adapter turns it back into ``OptimizeOptions``.
Tests of the job machinery swap this reference (``MIRSERVE_ENGINE``, ``JobSettings.engine``) for a small
function with the same signature; everything else about a job (child process, limits, lease, publish) stays.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping


def run_optimize(model_path: str, output_path: str, options: Mapping[str, Any],
                 progress: Callable[[int, int, str], None], external_data_dir: str | None = None) -> dict:
    """``external_data_dir`` is given only for a model unpacked from an archive upload: the directory it was
    unpacked in, the one place its external data may be read from."""
    from worker.engine.api import OptimizeOptions, optimize

    return optimize(model_path, output_path, OptimizeOptions.from_dict(options), progress=progress,
                    external_data_dir=external_data_dir)
