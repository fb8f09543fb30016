"""Pictures of a finished job: its trace as a Chrome trace-event document or an SVG timeline, its memory
timeline, and its optimized graph coloured by place.

The first three are drawn from the published report (JSON the runner already checked). The graph is drawn from
the artifact, a model derived from an upload, so it is parsed and laid out only in a child process with an
address-space limit and a time limit (``mirserve draw``, Graphviz under it), and the SVG is stored beside the
report: later requests read it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from app.errors import NotFound, Unavailable
from app.services import Services, artifact, memory, report
from worker.jobs import Job, ObjectMissing

#: Limits of the drawing child: Graphviz takes minutes on graphs much larger than this.
GRAPH_MAX_NODES = 2000
GRAPH_MEMORY_MB = 2048
GRAPH_SECONDS = 90.0
GRAPH_SVG_LIMIT = 64 << 20


def chrome_trace(services: Services, job: Job) -> dict[str, Any]:
    from worker.engine.api import chrome_trace as to_chrome

    return to_chrome(report(services, job).to_dict(), title=f"mirserve job {job.id} ({job.input_filename})")


def trace_svg(services: Services, job: Job) -> str:
    from worker.engine.api import render_trace

    return render_trace(report(services, job).to_dict(), title=f"passes over time: {job.input_filename}")


def memory_timeline_svg(services: Services, job: Job, space: str | None) -> str:
    from worker.engine.api import render_timeline

    plan = memory(services, job)
    if space is not None:
        spaces = [a.get("space") for a in plan.get("arenas") or []]
        if space not in spaces:
            raise NotFound("no-such-memory-space", f"the job's memory plan has no space {space!r}; it has "
                           f"{', '.join(map(str, spaces)) or 'none'}", field="space", job_id=job.id)
        plan = {**plan, "arenas": [a for a in plan["arenas"] if a.get("space") == space],
                "unplanned": [u for u in plan.get("unplanned") or [] if u.get("space") == space]}
    return render_timeline(plan, f"live bytes per step: {job.input_filename}")


def graph_svg(services: Services, job: Job) -> bytes:
    """The SVG of the job's optimized graph, drawn on first request and stored beside the report."""
    local = artifact(services, job).path  # 409 before the job has succeeded, 404 without an artifact
    storage, files = services.files.storage, services.files
    key = files.graph_key(job.id, job.artifact_attempt)
    try:
        return storage.read_bytes(key, GRAPH_SVG_LIMIT)
    except ObjectMissing:
        pass
    with tempfile.TemporaryDirectory(prefix="mirserve-graph-") as scratch:
        model = local or Path(scratch) / "model.onnx"
        if local is None:  # the store is a bucket: the drawing child reads a local copy
            storage.get_file(files.artifact_key(job.id, job.artifact_attempt), model)
        drawn = Path(scratch) / "graph.svg"
        _draw(model, drawn, job)
        picture = drawn.read_bytes()
    storage.put_bytes(key, picture)  # whole or not at all: a concurrent request drew the same
    return picture


def _draw(model: Path, output: Path, job: Job) -> None:
    from worker.engine.api import draw_command

    command = draw_command(model, output, memory_limit_mb=GRAPH_MEMORY_MB, max_nodes=GRAPH_MAX_NODES,
                           title=job.input_filename)
    # Its own session, so that a time-out ends Graphviz too, not only the Python process above it.
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": _code_root()})
    try:
        _, err = child.communicate(timeout=GRAPH_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise NotFound("no-graph-picture", f"drawing the graph took longer than {GRAPH_SECONDS:g} s; download "
                       f"the model and run `mirserve draw` on it", job_id=job.id) from None
    if child.returncode == 0:
        return
    message = (err.decode(errors="replace").strip().splitlines() or [f"exit status {child.returncode}"])[-1]
    if "Graphviz" in message and "not installed" in message:
        raise Unavailable("graphviz-missing", f"this server cannot draw pictures: {message}", retry_after=3600)
    raise NotFound("no-graph-picture", f"the graph could not be drawn: {message[:300]}", job_id=job.id)


def _code_root() -> str:
    """The child imports this checkout's engine even when mirserve is not installed."""
    root = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
